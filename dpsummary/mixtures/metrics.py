"""Comparing mixture fits: Hungarian matching of components and the errors after matching."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment


def match_components(reference_means: np.ndarray, estimated_means: np.ndarray) -> np.ndarray:
    """For each reference component, the index of the estimated component assigned to it by the
    Hungarian algorithm on squared Euclidean distances between means (scipy
    ``linear_sum_assignment``). Requires at least as many estimated as reference components."""
    if estimated_means.shape[0] < reference_means.shape[0]:
        raise ValueError("need at least as many estimated as reference components")
    cost = ((reference_means[:, None, :] - estimated_means[None, :, :]) ** 2).sum(-1)
    rows, cols = linear_sum_assignment(cost)
    out = np.empty(reference_means.shape[0], dtype=np.int64)
    out[rows] = cols
    return out


@dataclass(frozen=True)
class ComponentErrors:
    """Per reference component, after matching: Euclidean error of the mean, relative Frobenius
    error of the covariance, the matched estimated weight, and whether it counts as recovered."""

    mean_error: np.ndarray
    covariance_error: np.ndarray
    matched_weight: np.ndarray
    recovered: np.ndarray


def component_errors(
    reference_weights: np.ndarray,
    reference_means: np.ndarray,
    reference_covariances: np.ndarray,
    estimated_weights: np.ndarray,
    estimated_means: np.ndarray,
    estimated_covariances: np.ndarray,
) -> ComponentErrors:
    """Errors of the estimated components matched to the reference ones.

    A reference component counts as *recovered* when its match carries at least half its weight
    and the matched mean lies within Mahalanobis distance 1 of the reference mean under the
    reference covariance (i.e. inside the component's own 1-sigma ellipsoid)."""
    match = match_components(reference_means, estimated_means)
    m_est, c_est, w_est = estimated_means[match], estimated_covariances[match], estimated_weights[match]
    diff = m_est - reference_means
    mean_err = np.sqrt((diff**2).sum(1))
    cov_err = np.linalg.norm(c_est - reference_covariances, axis=(1, 2)) / np.linalg.norm(
        reference_covariances, axis=(1, 2))
    maha = np.einsum("ki,ki->k", diff, np.linalg.solve(reference_covariances, diff[:, :, None])[:, :, 0])
    recovered = (w_est >= 0.5 * reference_weights) & (maha <= 1.0)
    return ComponentErrors(mean_err, cov_err, w_est, recovered)
