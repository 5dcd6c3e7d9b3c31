"""Training a drafter: anchors and the block attention mask, the DSpark losses, data sources, the trainer."""
