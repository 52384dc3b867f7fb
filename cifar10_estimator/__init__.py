"""CIFAR-10 ResNet training with tf.estimator: TensorFlow's classic multi-tower tutorial, revived."""

__version__ = "0.1.0"
