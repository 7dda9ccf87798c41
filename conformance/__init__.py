"""Conformance suite: every registered backend against the exact reference and each other."""
