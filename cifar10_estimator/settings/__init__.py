"""What the hyper-parameters decide, before any graph: the schedule (the last step, the
learning rate at each step, the shrunk images' steps), the precision (what training
computes in) and the named recipes. hparams and flags read them before TensorFlow loads."""
