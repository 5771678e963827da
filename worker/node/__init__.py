"""The node side: the worker agent, its API client, and the executors that run each job.

TensorFlow-free and independent of `service`: a GPU node talks to the API over HTTP only.
"""
