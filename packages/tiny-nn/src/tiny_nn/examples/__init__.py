"""Runnable demos: `python -m tiny_nn.examples.digits` (train a CNN on handwritten digits) and
`python -m tiny_nn.examples.embed "a sentence" ...` (all-MiniLM-L6-v2 sentence embeddings)."""
