"""scikit-learn's ``BayesianGaussianMixture`` as the reference implementation (full data only).

:func:`sklearn_estimator` builds the estimator with the prior of a :class:`MixturePrior` (the
mapping is one-to-one, see ``docs/MIXTURES.md``) and ``reg_covar=0``, so that on the same
initial responsibilities both implementations follow the same fixed-point iteration.
:func:`posterior_from_sklearn` reads a fitted estimator back into a :class:`MixturePosterior`,
so both fits are scored by the same predictive-density code.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .vi import MixturePosterior, MixturePrior


def sklearn_estimator(prior: MixturePrior, *, seed: int, max_iter: int = 1000, tol: float = 1e-10) -> Any:
    """An unfitted ``BayesianGaussianMixture`` (covariance_type="full", k-means init) with this prior."""
    from sklearn.mixture import BayesianGaussianMixture

    return BayesianGaussianMixture(
        n_components=prior.n_components,
        covariance_type="full",
        weight_concentration_prior_type=prior.process,
        weight_concentration_prior=prior.weight_concentration,
        mean_precision_prior=prior.mean_precision,
        mean_prior=prior.mean,
        degrees_of_freedom_prior=prior.degrees_of_freedom,
        covariance_prior=prior.covariance,
        reg_covar=0.0,
        tol=tol,
        max_iter=max_iter,
        init_params="kmeans",
        random_state=seed,
    )


def sklearn_initial_responsibilities(x: np.ndarray, n_components: int, seed: int) -> np.ndarray:
    """The one-hot responsibilities scikit-learn's "kmeans" initialisation starts from for
    ``random_state=seed`` (``KMeans(n_init=1)`` on the same ``RandomState`` stream)."""
    from sklearn.cluster import KMeans

    labels = KMeans(n_clusters=n_components, n_init=1, random_state=np.random.RandomState(seed)).fit(x).labels_
    return np.eye(n_components)[labels]


def posterior_from_sklearn(estimator: Any) -> MixturePosterior:
    """Our variational factors from a fitted estimator (``covariances_ = W^-1 / nu``)."""
    process = estimator.weight_concentration_prior_type
    conc = estimator.weight_concentration_
    conc = np.stack(conc, axis=1) if process == "dirichlet_process" else np.asarray(conc)
    dof = np.asarray(estimator.degrees_of_freedom_, dtype=np.float64)
    scale_inv = np.asarray(estimator.covariances_) * dof[:, None, None]
    return MixturePosterior(
        process, conc, np.asarray(estimator.mean_precision_, dtype=np.float64), np.asarray(estimator.means_),
        dof, scale_inv, np.linalg.cholesky(scale_inv),
    )
