"""Getting CIFAR-10 onto disk: download, safe archive reading, image folders, synthetic
archives, and the TFRecord format they are written in."""
