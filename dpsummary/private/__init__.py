"""Everything that touches private records or draws privacy noise lives in this package, and
nothing else: public plans, post-processing and orchestration live outside it (SECURITY.md, "What
a privacy reviewer reads", lists these modules with their line counts)."""
