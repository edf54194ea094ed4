"""``noise-aware-cells``' public parts (issue 50): the public feature domain from the schema
(:mod:`.domain`, light: no torch) and the noise-aware posterior of the released cell counts and
``T = sum_i [1, x_i] y_i`` (:mod:`.posterior`, post-processing). The mechanism that touches the
records is :mod:`dpsummary.private.cells`; the release stage is
:mod:`dpsummary.mechanisms.noise_aware_cells`.

Nothing is imported here, so ``check_public`` can read :mod:`.domain` without loading torch.
"""
