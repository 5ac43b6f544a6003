"""Containers: the Docker engine (digests, labelled containers) and the CI pre-warm built on it."""
