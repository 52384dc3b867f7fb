"""Getting CIFAR-10 onto disk: download, safe archive reading, synthetic archives."""
