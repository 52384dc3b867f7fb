"""The first convolution's starting filters from the training images' patches (--patch-pca-init).

airbench (Jordan 2024) starts its first layer as a whitening of the images' 2x2 patches:
the leading eigenvectors of the patches' covariance, each scaled by 1/sqrt(eigenvalue),
and their negatives. In the ResNet a batch norm follows the first convolution and scales
each output channel to unit variance, which is that scaling; so the filters start as the
unit eigenvectors themselves (times the norm He et al.'s initialisation gives a filter
on average), and the batch norm whitens. The filters then train like the others.
"""

import numpy as np

# Patches are sampled from this many training images: the covariance of 27 numbers
# settles long before, and the whole training set would take seconds for nothing.
MAX_IMAGES = 2000
# Images per chunk, to bound the memory of the patch matrix (about 100 MB in float32).
_CHUNK_IMAGES = 1000


def patch_covariance(images, kernel_size):
    """Covariance [k*k*C, k*k*C] of every kernel_size x kernel_size patch of `images`.

    Args:
      images: uint8 or float [N, H, W, C], pixel values 0..255; standardised as the
        network's forward pass does (x / 128 - 1) before the patches are taken.
      kernel_size: the patches' side.

    Patches are flattened in (row, column, channel) order, as a Conv2D kernel's first
    three axes are.
    """
    size = kernel_size * kernel_size * images.shape[-1]
    total = np.zeros([size], np.float64)
    outer = np.zeros([size, size], np.float64)
    count = 0
    for start in range(0, len(images), _CHUNK_IMAGES):
        chunk = images[start:start + _CHUNK_IMAGES].astype(np.float32) / 128 - 1
        windows = np.lib.stride_tricks.sliding_window_view(
            chunk, (kernel_size, kernel_size), axis=(1, 2))  # [N, H', W', C, k, k]
        patches = windows.transpose(0, 1, 2, 4, 5, 3).reshape(-1, size)
        total += patches.sum(axis=0, dtype=np.float64)
        outer += patches.T.astype(np.float64) @ patches.astype(np.float64)
        count += len(patches)
    mean = total / count
    return outer / count - np.outer(mean, mean)


def first_conv_kernel(images, filters, kernel_size=3, max_images=MAX_IMAGES):
    """A Conv2D kernel [k, k, C, filters]: the leading filters/2 principal directions of
    the images' patches, then their negatives, each of norm sqrt(2).

    Args:
      images: uint8 [N, H, W, C] training images, pixel values 0..255; the first
        max_images are used.
      filters: the convolution's output channels, even, at most 2 * k * k * C.

    Raises:
      ValueError: `filters` is odd or more than the patches have directions for, or
        there are no images.
    """
    num_channels = images.shape[-1]
    size = kernel_size * kernel_size * num_channels
    if filters % 2 or filters > 2 * size:
        raise ValueError("filters must be even and at most %d, got %d" % (2 * size, filters))
    if len(images) == 0:
        raise ValueError("no images to take patches from")
    _, eigenvectors = np.linalg.eigh(patch_covariance(images[:max_images], kernel_size))
    leading = eigenvectors[:, ::-1][:, :filters // 2]  # eigh sorts eigenvalues ascending
    # He et al.'s N(0, 2 / fan_in) gives a filter of squared norm 2 on average.
    directions = np.sqrt(2.0) * np.concatenate([leading, -leading], axis=1)
    return directions.reshape(kernel_size, kernel_size, num_channels, filters).astype(np.float32)
