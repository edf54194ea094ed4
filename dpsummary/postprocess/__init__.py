"""Post-processing of released values, and the public plans of the mechanisms in
:mod:`dpsummary.private`. Nothing here reads a record or draws privacy noise: every input is public
(the policy, the schema, options) or already released (noisy counts and sums)."""
