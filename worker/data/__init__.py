"""Training data: the stateless dataset, the built-in generators, the `arrays` generator
over stored dataset files, and a job's training and evaluation streams."""
