"""NUTS with an adapted mass matrix (BlackJAX; dense, diagonal at large d), warm-started from a Gaussian.

Why BlackJAX (issue 48): ``Release.sample()`` used a hand-written HMC (fixed 10 leapfrog steps,
diagonal mass, no convergence check) that did not mix on correlated release posteriors (the
NAPSU-MQ problem: means 0.8 sd off, sds 45% narrow, a different answer per seed). Measured on
the same releases (``benchmarks/sampling.py``, results in ``benchmarks/results/sampling.md``):
BlackJAX's NUTS with Stan's window adaptation of a dense mass matrix agrees with an independent
importance-sampling reference and with NumPyro, PyMC and Stan, with R-hat <= 1.01 and ESS above
the draws' count at d = 7, in about 0.4 s per 4,000 draws after a one-off compilation. BlackJAX
is maintained, small on top of JAX (which NumPyro, the exporters' sampler, also uses), and its
algorithms are explicit ``init``/``step`` functions over state, the shape this project's own
algorithms follow. NumPyro's NUTS (same JAX) would do as well; Pyro (torch) ran one chain in
about 100 s here (``../shared/notes/samplers.md``), too slow for ``sample()``.

How it runs (all of it public post-processing of a release: it costs no privacy):

* **Whitened coordinates.** The sampler moves ``z`` with ``theta = m + L z`` for the release's
  Gaussian ``N(m, L L^T)`` (the signed one, or the pseudocoreset's Laplace approximation), so the
  posterior it sees is close to ``N(0, I)`` whatever the release's correlations; the mass
  matrix is still adapted, in ``z``, for what the Gaussian misses (skew, heavier tails).
* **Dense or diagonal mass matrix** (:func:`mass_matrix_is_dense`). Dense where the warm-up's last
  slow window holds at least :data:`DENSE_DRAWS_PER_DIM` draws per dimension, diagonal below. A
  dense ``d x d`` estimate from fewer draws is noisy (Marchenko-Pastur: its eigenvalues scatter
  over ``(1 +- sqrt(d / n))^2``) or, below ``d`` draws, rank-deficient; then a few directions of
  the dynamics barely move, trajectories never turn back and NUTS runs to its maximum tree depth
  on every draw. Measured on an adult public-schema release (d = 106, 300 warm-up steps, last
  window 100 draws): 965-989 leapfrog steps per draw and 80-86 s per run dense, 11-14 steps and
  1-4 s diagonal, at the same agreement with a long reference
  (``benchmarks/notebook/moment_match_stopping.md``, session 65). In whitened coordinates the
  identity is already close, so the diagonal loses little.
* **Warm start.** Chains start at independent draws of that Gaussian (``z ~ N(0, I)``), so they
  start over-dispersed relative to nothing and in the typical set, as R-hat assumes.
* **Adaptation.** Stan's windowed warm-up (Hoffman & Gelman 2014 dual averaging of the step
  size towards ``target_accept``; Stan's expanding windows for the mass matrix), per chain.
* **Compilation.** A GLM's program is compiled once per (family, shape, settings) and reused:
  the data are arguments, not constants. Other models go through a host callback
  (:func:`dpsummary.sampling.densities.torch_log_density`) and compile per call.

Randomness: a JAX PRNG key from ``seed`` (reproducible) or, with ``seed=None``, from the OS
(:func:`secrets.randbits`); no global state is read or set. JAX's 64-bit mode is switched on only
inside these calls (``jax.enable_x64``; for a torch-callback density process-wide for the run,
then restored, see :func:`run_nuts`).
"""

from __future__ import annotations

import functools
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from .diagnostics import Diagnostics, diagnose

#: Stan's default target acceptance rate and tree depth.
TARGET_ACCEPT = 0.8
MAX_TREE_DEPTH = 10
#: Fewer warm-up steps than this leave Stan's adaptation windows too short to estimate a mass
#: matrix; the sampler refuses rather than run a warm-up it knows is too short.
MIN_WARMUP = 100
#: A dense mass matrix is adapted only when the warm-up's last slow window holds at least this
#: many draws per dimension (a condition number of the estimate's noise below about 4 needs
#: n >= 9 d, Marchenko-Pastur); below it the adaptation is diagonal.
DENSE_DRAWS_PER_DIM = 10
MassMatrix = Literal["auto", "dense", "diagonal"]
MASS_MATRICES: tuple[MassMatrix, ...] = ("auto", "dense", "diagonal")


@dataclass(frozen=True)
class NutsSettings:
    """Chains, warm-up and kept draws per chain, target acceptance, tree depth and the mass
    matrix's form (``"auto"``: :func:`mass_matrix_is_dense`; ``"dense"``; ``"diagonal"``)."""

    chains: int = 4
    num_warmup: int = 1000
    draws_per_chain: int = 1000
    target_accept: float = TARGET_ACCEPT
    max_tree_depth: int = MAX_TREE_DEPTH
    mass_matrix: MassMatrix = "auto"

    def __post_init__(self) -> None:
        if self.chains < 1:
            raise ValueError("chains must be at least 1")
        if self.num_warmup < MIN_WARMUP:
            raise ValueError(f"num_warmup must be at least {MIN_WARMUP} (NUTS adapts its mass matrix in warm-up)")
        if self.draws_per_chain < 4:
            raise ValueError("need at least 4 draws per chain")
        if not 0.0 < self.target_accept < 1.0:
            raise ValueError("target_accept must be in (0, 1)")
        if not 1 <= self.max_tree_depth <= 15:
            raise ValueError("max_tree_depth must be in [1, 15]")
        if self.mass_matrix not in MASS_MATRICES:
            raise ValueError(f"mass_matrix must be one of {', '.join(MASS_MATRICES)}")


def last_window_draws(num_warmup: int) -> int:
    """Draws in the last slow window of Stan's windowed warm-up (BlackJAX's schedule): the
    window whose estimate becomes the sampling mass matrix."""
    import jax
    from blackjax.adaptation.window_adaptation import build_schedule

    with jax.ensure_compile_time_eval():  # a function of the public warm-up length, also inside jit
        schedule = np.asarray(build_schedule(num_warmup), dtype=bool)  # (step, [slow, window ends])
    slow = np.flatnonzero(schedule[:, 0])
    ends = np.flatnonzero(schedule[:, 1])
    if ends.size == 0:
        return 0
    start = ends[-2] + 1 if ends.size > 1 else slow[0]
    return int(ends[-1] - start + 1)


def mass_matrix_is_dense(dim: int, settings: NutsSettings) -> bool:
    """Whether ``settings`` adapt a dense mass matrix at dimension ``dim``: as asked, or with
    ``"auto"`` when the last slow window holds at least ``DENSE_DRAWS_PER_DIM * dim`` draws
    (module docstring). A function of public shapes only."""
    if settings.mass_matrix != "auto":
        return settings.mass_matrix == "dense"
    return last_window_draws(settings.num_warmup) >= DENSE_DRAWS_PER_DIM * dim


@dataclass(frozen=True)
class Draws:
    """NUTS draws ``values`` ``(chains, draws_per_chain, d)`` with their diagnostics."""

    values: np.ndarray
    diagnostics: Diagnostics
    names: list[str] = field(default_factory=list)
    divergent: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=bool))  # (chains, draws)
    step_size: np.ndarray = field(default_factory=lambda: np.zeros(0))  # (chains,)
    mean_tree_steps: float = float("nan")

    def flat(self) -> np.ndarray:
        """All draws, chain after chain, ``(chains * draws_per_chain, d)``."""
        c, n, d = self.values.shape
        return self.values.reshape(c * n, d)

    def problems(self) -> list[str]:
        return self.diagnostics.problems(self.names or None)

    def to_inference_data(self) -> Any:
        """An ArviZ ``InferenceData`` with one variable per parameter (named as ``inspect``
        names them) and the divergences in ``sample_stats``. Needs ArviZ installed."""
        try:
            import arviz as az
        except ImportError:  # pragma: no cover - depends on the environment
            raise ImportError("InferenceData needs ArviZ: pip install 'arviz<1'") from None
        names = self.names or [f"theta[{j}]" for j in range(self.values.shape[2])]
        posterior = {name: self.values[:, :, j] for j, name in enumerate(names)}
        c, n, _ = self.values.shape
        diverging = self.divergent if self.divergent.shape == (c, n) else np.zeros((c, n), dtype=bool)
        return az.from_dict(posterior=posterior, sample_stats={"diverging": diverging},
                            attrs={"divergences_total": self.diagnostics.divergences})


def _nuts_chains(log_density_z: Callable[[Any], Any], key: Any, dim: int, settings: NutsSettings) -> Any:
    """Warm-up and draws of ``settings.chains`` independent NUTS chains in whitened space."""
    import blackjax
    import jax

    k_start, k_adapt, k_draw = jax.random.split(key, 3)
    starts = jax.random.normal(k_start, (settings.chains, dim))
    adaptation = blackjax.window_adaptation(
        blackjax.nuts, log_density_z, is_mass_matrix_diagonal=not mass_matrix_is_dense(dim, settings),
        target_acceptance_rate=settings.target_accept, max_num_doublings=settings.max_tree_depth)

    def one_chain(k_a: Any, k_d: Any, start: Any) -> Any:
        (state, params), _ = adaptation.run(k_a, start, settings.num_warmup)
        step = blackjax.nuts(log_density_z, **params).step  # params carry the tree depth

        def body(s: Any, k: Any) -> Any:
            s, info = step(k, s)
            return s, (s.position, info.is_divergent, info.num_integration_steps)

        _, (positions, divergent, steps) = jax.lax.scan(body, state, jax.random.split(k_d, settings.draws_per_chain))
        return positions, divergent, steps, params["step_size"]

    return jax.vmap(one_chain)(jax.random.split(k_adapt, settings.chains), jax.random.split(k_draw, settings.chains),
                               starts)


@functools.lru_cache(maxsize=32)
def _glm_program(family: str, settings: NutsSettings) -> Callable[..., Any]:
    """The jit-compiled NUTS run of a weighted GLM posterior (data as arguments)."""
    import jax

    from .densities import glm_log_density

    def run(key: Any, design: Any, target: Any, weights: Any, prior_mean: Any, prior_scale: Any,
            noise_scale: Any, centre: Any, tril: Any) -> Any:
        log_density = glm_log_density(family, design, target, weights, prior_mean, prior_scale, noise_scale)
        return _nuts_chains(lambda z: log_density(centre + tril @ z), key, centre.shape[0], settings)

    return jax.jit(run)


def _key(seed: int | None) -> Any:
    import jax

    return jax.random.key(secrets.randbits(63) if seed is None else int(seed) % (2**63))


def run_nuts(
    *,
    centre: np.ndarray,
    tril: np.ndarray,
    settings: NutsSettings,
    seed: int | None,
    glm: Any = None,
    log_density: Callable[[Any], Any] | None = None,
    names: list[str] | None = None,
) -> Draws:
    """NUTS draws of a posterior given in ``theta`` space, whitened by ``N(centre, tril tril^T)``.

    Pass ``glm`` (a :class:`dpsummary.sampling.densities.GlmData`, compiled and cached) or a JAX
    ``log_density`` (``theta (d,) -> scalar``, e.g. :func:`torch_log_density`)."""
    import jax
    import jax.numpy as jnp

    centre = np.asarray(centre, dtype=np.float64)
    tril = np.asarray(tril, dtype=np.float64)
    if not (np.isfinite(centre).all() and np.isfinite(tril).all()):
        raise ValueError("the sampler's starting Gaussian is not finite")
    if glm is not None:
        with jax.enable_x64(True):
            program = _glm_program(glm.family, settings)
            out = program(_key(seed), *(jnp.asarray(a) for a in glm.arrays()), jnp.asarray(centre), jnp.asarray(tril))
            positions, divergent, steps, step_size = (np.asarray(a) for a in out)
    elif log_density is not None:
        # The torch density runs in a host callback on another thread, where the thread-local
        # ``jax.enable_x64`` context does not reach (JAX would cast its float64 result to
        # float32 and refuse it): 64-bit mode is switched on process-wide for the run and
        # restored after it.
        previous = bool(jax.config.read("jax_enable_x64"))
        jax.config.update("jax_enable_x64", True)
        try:
            c, t = jnp.asarray(centre), jnp.asarray(tril)
            lp = log_density
            out = jax.jit(lambda k: _nuts_chains(lambda z: lp(c + t @ z), k, c.shape[0], settings))(_key(seed))
            positions, divergent, steps, step_size = (np.asarray(a) for a in out)
        finally:
            jax.config.update("jax_enable_x64", previous)
    else:
        raise ValueError("pass glm= or log_density=")
    values = centre + np.einsum("ij,cnj->cni", tril, positions)
    diag = diagnose(values, divergences=int(divergent.sum()))
    return Draws(values=values, diagnostics=diag, names=list(names or []), divergent=divergent.astype(bool),
                 step_size=step_size,
                 mean_tree_steps=float(steps.mean()))
