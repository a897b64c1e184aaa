"""Training: the embedded recipe with its MTP module, DFlash drafters, their checkpoints and the model card's acceptance."""
