"""Training: the embedded recipe and its MTP module, DFlash drafters, checkpoints, and the card's acceptance."""
