"""Training: fine-tune models on a collection's judgments (above evaluation in the layers)."""
