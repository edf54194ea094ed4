"""Standalone adapter files copied verbatim into an export directory.

Each one reads the sampler-neutral ``release.json`` (docs/FORMAT.md) that sits beside it and
needs no dpsummary: an analyst can hand the directory to anyone with the sampler installed.
The exporters also import these very modules in-process, so the tested code is the shipped code.
"""
