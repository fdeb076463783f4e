"""What runs the model on one device: inputs from a scheduled batch, the forward pass, sampling."""
