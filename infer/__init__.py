"""Inference helpers shared by eval/ and scripts/: generation, the --rope-scaling flags, the transformers mapping."""
