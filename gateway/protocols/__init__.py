"""Wire formats of the two public APIs: request and response models, and their translation."""
