"""Using a trained model: SavedModel export, predict on image files, evaluate a checkpoint."""
