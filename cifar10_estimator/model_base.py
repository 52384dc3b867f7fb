"""ResNet building blocks: convolution, batch norm, residual units, pooling.

Graph-mode (tf.compat.v1) layers, in either data format. Papers:
  He et al. 2016, Deep Residual Learning for Image Recognition (arXiv:1512.03385);
  He et al. 2016, Identity Mappings in Deep Residual Networks (arXiv:1603.05027);
  Zagoruyko & Komodakis 2016, Wide Residual Networks (arXiv:1605.07146).

Variable names follow the original tutorial's checkpoints: `conv2d[_k]/kernel`,
`BatchNorm[_k]/{gamma,beta,moving_mean,moving_variance}` and `dense/{kernel,bias}`.
"""

import dataclasses

import tensorflow as tf

from cifar10_estimator.hparams import ConfigFromHParams, DEFAULTS

DATA_FORMATS = ("channels_first", "channels_last")

# He et al. initialise convolutions with N(0, 2 / fan_in) ("Delving Deep into
# Rectifiers"); the tutorial left tf.layers' Glorot-uniform default. Every
# convolution is followed by batch norm, so both train; we follow the paper.
_CONV_INITIALIZER = tf.compat.v1.variance_scaling_initializer(
    scale=2.0, mode="fan_in", distribution="truncated_normal")


@dataclasses.dataclass(frozen=True)
class ModelConfig(ConfigFromHParams):
    """The network's hyper-parameters, handed whole to the network and its blocks
    (ResNet.from_config); the run builds it once from its HParams (from_hparams). Where
    the network computes (its data format) is the devices' choice, not the model's.

    Attributes:
      num_layers: the depth of the network a subclass builds (ResNetCifar10: 6n + 2).
      batch_norm_decay: momentum of the moving mean and variance.
      batch_norm_epsilon: added to the variance to avoid dividing by zero.
      zero_init_residual: start the scale (gamma) of each residual unit's last batch
        norm at 0 rather than 1, so every unit starts as the identity (Goyal et al.
        2017); the variables and checkpoints are the same either way.
    """

    num_layers: int = DEFAULTS.num_layers
    batch_norm_decay: float = DEFAULTS.batch_norm_decay
    batch_norm_epsilon: float = DEFAULTS.batch_norm_epsilon
    zero_init_residual: bool = DEFAULTS.zero_init_residual


class ResNet:
    """Base class of ResNet models: the building blocks; subclasses define forward_pass.

    `config` is the ModelConfig the network was built from.
    """

    def __init__(self, is_training, data_format, batch_norm_decay, batch_norm_epsilon,
                 zero_init_residual=False):
        """The tutorial's constructor, each hyper-parameter an argument (the trainer
        builds networks with from_config).

        Args:
          is_training: build the training graph (batch statistics, moving-average
            updates in UPDATE_OPS) rather than the inference graph.
          data_format: layout used inside the network, 'channels_first' (NCHW,
            fastest on GPU) or 'channels_last' (NHWC, the only one CPU kernels
            support without oneDNN).
          batch_norm_decay, batch_norm_epsilon, zero_init_residual: see ModelConfig.

        Raises:
          ValueError: data_format is not one of DATA_FORMATS.
        """
        self._set_up(ModelConfig(batch_norm_decay=batch_norm_decay,
                                 batch_norm_epsilon=batch_norm_epsilon,
                                 zero_init_residual=zero_init_residual),
                     is_training, data_format)

    @classmethod
    def from_config(cls, config, is_training, data_format, **arguments):
        """The network `config` (a ModelConfig) describes, for training or inference
        (is_training), computing in `data_format`; `arguments` are a subclass's other
        constructor arguments (ResNetCifar10's num_classes).

        Raises:
          ValueError: as the constructor.
        """
        # Not through __init__, which takes the hyper-parameters one by one.
        network = cls.__new__(cls)
        network._set_up(config, is_training, data_format, **arguments)
        return network

    def _set_up(self, config, is_training, data_format):
        """What both constructors do: check the data format and keep the config whole."""
        if data_format not in DATA_FORMATS:
            raise ValueError("data_format must be 'channels_first' or 'channels_last', got %r"
                             % (data_format,))
        self.config = config
        self._is_training = is_training
        self._data_format = data_format

    @property
    def data_format(self):
        return self._data_format

    def forward_pass(self, x):
        raise NotImplementedError("forward_pass() is implemented by ResNet subclasses")

    def _residual_v1(self, x, kernel_size, in_filter, out_filter, stride,
                     activate_before_residual=False):
        """Original residual unit: conv-bn-relu-conv-bn, add the shortcut, relu.

        The shortcut is the identity, or when the shape changes "option A":
        average-pool by the stride and zero-pad the new channels (no parameters).
        activate_before_residual is accepted for a common signature and ignored.
        """
        del activate_before_residual
        with tf.name_scope("residual_v1") as name_scope:
            shortcut = x
            x = self._conv(x, kernel_size, out_filter, stride)
            x = self._batch_norm(x)
            x = self._relu(x)
            x = self._conv(x, kernel_size, out_filter, 1)
            x = self._batch_norm(x, is_last_in_unit=True)
            shortcut = self._option_a_shortcut(shortcut, in_filter, out_filter, stride)
            x = self._relu(tf.add(x, shortcut))
            _log_shape(name_scope, x)
            return x

    def _residual_v2(self, x, in_filter, out_filter, stride, activate_before_residual=False):
        """Pre-activation residual unit (bn-relu-conv twice), option A shortcut.

        With activate_before_residual the shortcut starts after the first bn-relu
        (used by the first unit after a plain convolution).
        """
        with tf.name_scope("residual_v2") as name_scope:
            x, shortcut = self._pre_activation(x, activate_before_residual)
            x = self._conv(x, 3, out_filter, stride)
            x = self._batch_norm(x)
            x = self._relu(x)
            x = self._conv(x, 3, out_filter, 1)
            shortcut = self._option_a_shortcut(shortcut, in_filter, out_filter, stride)
            x = tf.add(x, shortcut)
            _log_shape(name_scope, x)
            return x

    def _bottleneck_residual_v2(self, x, in_filter, out_filter, stride,
                                activate_before_residual=False):
        """Pre-activation bottleneck unit (1x1, 3x3, 1x1 at out_filter / 4 wide).

        As in the tutorial, a shape change uses a 1x1 projection shortcut
        ("option B") and the stride sits on the first 1x1 convolution.
        """
        with tf.name_scope("bottle_residual_v2") as name_scope:
            x, shortcut = self._pre_activation(x, activate_before_residual)
            x = self._conv(x, 1, out_filter // 4, stride, is_atrous=True)
            x = self._batch_norm(x)
            x = self._relu(x)
            x = self._conv(x, 3, out_filter // 4, 1, is_atrous=True)
            x = self._batch_norm(x)
            x = self._relu(x)
            x = self._conv(x, 1, out_filter, 1, is_atrous=True)
            if stride != 1 or in_filter != out_filter:
                shortcut = self._conv(shortcut, 1, out_filter, stride, is_atrous=True)
            x = tf.add(x, shortcut)
            _log_shape(name_scope, x)
            return x

    def _pre_activation(self, x, activate_before_residual):
        """(bn-relu of x, the shortcut input) for the v2 units."""
        if activate_before_residual:
            x = self._relu(self._batch_norm(x))
            return x, x
        return self._relu(self._batch_norm(x)), x

    def _option_a_shortcut(self, x, in_filter, out_filter, stride):
        """Parameter-free shortcut: average-pool by the stride, zero-pad new channels."""
        if out_filter < in_filter:
            raise ValueError("an option-A shortcut cannot drop channels (%d -> %d)"
                             % (in_filter, out_filter))
        if stride != 1:
            x = self._avg_pool(x, stride, stride)
        if out_filter != in_filter:
            pad_begin = (out_filter - in_filter) // 2
            pad_end = out_filter - in_filter - pad_begin
            x = _zero_pad(x, [self._channel_axis()], pad_begin, pad_end)
        return x

    def _conv(self, x, kernel_size, filters, strides, is_atrous=False):
        """Convolution without bias, its kernel started as He et al. start theirs.

        A strided convolution pads explicitly and symmetrically, then uses 'valid'
        padding, so its output does not depend on the input size's parity the way
        'same' padding's does; otherwise (or when is_atrous) it uses 'same'.
        """
        padding = "same"
        if not is_atrous and strides > 1:
            pad_total = kernel_size - 1
            pad_begin = pad_total // 2
            pad_end = pad_total - pad_begin
            x = _zero_pad(x, self._spatial_axes(), pad_begin, pad_end)
            padding = "valid"
        layer = tf.compat.v1.layers.Conv2D(
            filters=filters, kernel_size=kernel_size, strides=strides, padding=padding,
            use_bias=False, kernel_initializer=_CONV_INITIALIZER,
            data_format=self._data_format)
        return layer(x)

    def _batch_norm(self, x, is_last_in_unit=False):
        """Fused batch norm with scale and offset; moving-average updates go to UPDATE_OPS.

        The layer is named BatchNorm (BatchNorm_1, ...) like tf.contrib.layers.batch_norm,
        which the tutorial used, so its checkpoints' variable names carry over.
        is_last_in_unit: the batch norm before a residual unit's addition, whose scale
        starts at 0 with the config's zero_init_residual.
        """
        zero_scale = is_last_in_unit and self.config.zero_init_residual
        layer = tf.compat.v1.layers.BatchNormalization(
            axis=self._channel_axis(), momentum=self.config.batch_norm_decay,
            epsilon=self.config.batch_norm_epsilon, center=True, scale=True, fused=True,
            gamma_initializer=tf.compat.v1.zeros_initializer() if zero_scale
            else tf.compat.v1.ones_initializer(),
            name="BatchNorm")
        return layer(x, training=self._is_training)

    def _relu(self, x):
        return tf.nn.relu(x)

    def _fully_connected(self, x, out_dim):
        with tf.name_scope("fully_connected") as name_scope:
            x = tf.compat.v1.layers.Dense(out_dim)(x)
        _log_shape(name_scope, x)
        return x

    def _avg_pool(self, x, pool_size, stride):
        with tf.name_scope("avg_pool") as name_scope:
            layer = tf.compat.v1.layers.AveragePooling2D(
                pool_size, stride, padding="same", data_format=self._data_format)
            x = layer(x)
        _log_shape(name_scope, x)
        return x

    def _global_avg_pool(self, x):
        with tf.name_scope("global_avg_pool") as name_scope:
            if x.shape.ndims != 4:
                raise ValueError("global average pooling needs a 4-D input, got shape %s"
                                 % (x.shape,))
            x = tf.reduce_mean(x, self._spatial_axes())
        _log_shape(name_scope, x)
        return x

    def _channel_axis(self):
        return 1 if self._data_format == "channels_first" else 3

    def _spatial_axes(self):
        return [2, 3] if self._data_format == "channels_first" else [1, 2]


def _zero_pad(x, axes, pad_begin, pad_end):
    """Pad the 4-D tensor x with zeros, pad_begin before and pad_end after each of axes."""
    paddings = [[pad_begin, pad_end] if axis in axes else [0, 0] for axis in range(4)]
    return tf.pad(x, paddings)


def _log_shape(name_scope, x):
    tf.compat.v1.logging.info("image after unit %s: %s", name_scope, x.shape)
