"""Models, their layers and the loader that fills them from a checkpoint."""
