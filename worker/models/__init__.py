"""Models: the built-in architectures, the registry of components, their parameters and
sizes (all but the architectures are TensorFlow-free, so the API validates with them)."""
