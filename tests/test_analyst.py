"""The analyst API: load + verify a release, reference log density, sampling, predictive, CLI."""

from __future__ import annotations

import base64
import json
import math

import numpy as np
import pytest
import torch
from scipy import stats
from scipy.special import expit, gammaln

import dpsummary
from dpsummary import keys
from dpsummary.analyst import Release, ReleaseFormatError, load
from dpsummary.artifact import ArtifactError, write_artifact
from dpsummary.constructors.base import Summary
from dpsummary.data import ColumnSpec, Schema, Transform
from dpsummary.inference import weighted_log_posterior
from dpsummary.models import DTYPE, from_spec

CLAIM = {
    "epsilon": {"rdp": 1.0, "prv": 0.95, "pld": 0.94},
    "delta": 1e-6,
    "adjacency": "add/remove one record",
    "sampling": "poisson",
    "events": [],
    "mechanism": {"name": "dp-psvi"},
}

SCHEMA = Schema(
    columns=[
        ColumnSpec(name="age", kind="numeric", lower=18, upper=80),
        ColumnSpec(name="job", kind="categorical", categories=["a", "b", "c"]),
        ColumnSpec(name="y", kind="categorical", categories=["no", "yes"]),
    ],
    target="y",
)


def make_summary(name: str, *, m: int = 12, k: int = 4, seed: int = 0, transform: dict | None = None,
                 **spec) -> Summary:
    """A pseudocoreset with soft labels / fractional counts / real targets and one zero weight."""
    g = torch.Generator().manual_seed(seed)
    model = from_spec({"name": name, "num_features": k, **spec})
    x = torch.rand(m, k, generator=g, dtype=DTYPE) * 2 - 1
    if name == "logistic":
        y = torch.rand(m, 1, generator=g, dtype=DTYPE)
        y[0] = 0.3
    elif name == "poisson":
        y = 4 * torch.rand(m, 1, generator=g, dtype=DTYPE)
        y[0] = 1.5
    elif name == "linear":
        y = torch.randn(m, 1, generator=g, dtype=DTYPE)
    else:
        y = None
    pts = x if y is None else torch.cat([x, y], 1)
    w = 0.5 + 10 * torch.rand(m, generator=g, dtype=DTYPE)
    w[1] = 0.0
    return Summary(pts, w, model, "test", transform)


def make_artifact(tmp_path, summary: Summary, *, sign: bool = True):
    info = keys.generate_keypair(tmp_path / "keys")
    model = summary.model
    tr = Transform.from_dict(summary.transform) if summary.transform else None
    feats = tr.feature_names if tr else [f"f{i}" for i in range(model.num_features)]
    body = {
        "format": "dpsummary.release/v1",
        "summary": summary.to_dict(),
        "feature_names": feats,
        "param_names": model.param_names(feats),
        "software": {"dpsummary": dpsummary.__version__},
        "created": "2025-01-01T00:00:00+00:00",
        "release_id": "abc123",
    }
    path = tmp_path / "rel.dpsummary.json"
    priv = keys.load_private_key(info.private_path) if sign else None
    write_artifact(path, body, CLAIM, priv, info.keyid if sign else None)
    return path, info.public_path


FAMILIES = [
    ("gaussian_mean", {"noise_scale": 0.7, "prior_scale": 2.0}),
    ("linear", {"noise_scale": 0.5, "prior_scale": 1.5}),
    ("logistic", {}),
    ("poisson", {"prior_scale": 0.5}),
]


def manual_log_density(summary: Summary, theta: np.ndarray) -> float:
    """Independent scipy formula for one theta."""
    model = summary.model
    pts = summary.points.numpy()
    w = summary.weights.numpy()
    k = model.num_features
    lp = stats.norm(0, model.prior_scale).logpdf(theta).sum()
    if model.name == "gaussian_mean":
        ll = stats.norm(theta, model.noise_scale).logpdf(pts).sum(1)
    else:
        x, y = pts[:, :k], pts[:, k]
        eta = theta[0] + x @ theta[1:]
        if model.name == "linear":
            ll = stats.norm(eta, model.noise_scale).logpdf(y)
        elif model.name == "logistic":
            ll = y * np.log(expit(eta)) + (1 - y) * np.log(expit(-eta))
        else:
            ll = y * eta - np.exp(eta) - gammaln(y + 1)
    return float(w @ ll + lp)


@pytest.mark.parametrize(("name", "spec"), FAMILIES)
def test_load_round_trip_and_log_density(tmp_path, name, spec):
    summary = make_summary(name, **spec)
    path, pub = make_artifact(tmp_path, summary)
    rel = load(path, key=pub)
    assert rel.verified and rel.envelope["keyid"]
    assert rel.claim == CLAIM and rel.epsilon["rdp"] == 1.0 and rel.delta == 1e-6
    assert torch.equal(rel.points, summary.points) and torch.equal(rel.weights, summary.weights)
    assert rel.model == summary.model
    assert rel.prior == {"family": "normal", "independent": True, "mean": [0.0] * rel.dim,
                         "scale": summary.model.prior_scale}
    assert len(rel.param_names) == rel.dim
    assert "verified=True" in repr(rel)

    rng = np.random.default_rng(0)
    thetas = rng.normal(size=(3, 5, rel.dim))
    out = rel.log_density(thetas)
    assert isinstance(out, np.ndarray) and out.shape == (3, 5) and out.dtype == np.float64
    for idx in [(0, 0), (1, 3), (2, 4)]:
        assert out[idx] == pytest.approx(manual_log_density(summary, thetas[idx]), rel=1e-10)
    # torch: same values, differentiable, batched; equals the core weighted_log_posterior.
    t = torch.tensor(thetas, dtype=DTYPE, requires_grad=True)
    tout = rel.log_density(t)
    assert isinstance(tout, torch.Tensor) and tout.shape == (3, 5)
    np.testing.assert_allclose(tout.detach().numpy(), out, rtol=1e-12)
    tout.sum().backward()
    assert t.grad is not None and torch.isfinite(t.grad).all()
    core = weighted_log_posterior(summary.model, summary.points, summary.weights, t.detach().reshape(-1, rel.dim))
    np.testing.assert_allclose(core.numpy(), out.reshape(-1), rtol=1e-12)
    # a single theta gives a 0-d array (float() it for emcee); a list works too.
    assert float(rel.log_density(thetas[0, 0].tolist())) == pytest.approx(out[0, 0], rel=1e-12)
    with pytest.raises(ValueError, match="shape"):
        rel.log_density(np.zeros(rel.dim + 1))


def test_package_level_load_forwards(tmp_path):
    path, pub = make_artifact(tmp_path, make_summary("logistic"))
    rel = dpsummary.load(str(path), key=str(pub))
    assert isinstance(rel, Release) and rel.verified


def test_tampered_unsigned_and_foreign_key_refused(tmp_path):
    summary = make_summary("logistic")
    path, pub = make_artifact(tmp_path, summary)
    env = json.loads(path.read_bytes())
    st = json.loads(base64.b64decode(env["payload"]))
    # Tamper with one weight (keeping the envelope well formed and canonical).
    st["predicate"]["body"]["summary"]["weights"][0] *= 2
    from dpsummary.artifact import canonical_json

    env["payload"] = base64.b64encode(canonical_json(st)).decode()
    bad = tmp_path / "tampered.json"
    bad.write_bytes(canonical_json(env) + b"\n")
    with pytest.raises(ArtifactError):
        load(bad, key=pub)
    with pytest.raises(ArtifactError):
        load(bad, key=pub, allow_unsigned=True)
    # A flipped byte in the file.
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x04
    bad.write_bytes(bytes(data))
    with pytest.raises(ArtifactError):
        load(bad, key=pub)
    # Another key.
    other = keys.generate_keypair(tmp_path / "other").public_path
    with pytest.raises(ArtifactError, match="not signed by key"):
        load(path, key=other)
    # Unsigned: refused unless allowed, then flagged unverified.
    upath, upub = make_artifact(tmp_path / "u", summary, sign=False)
    with pytest.raises(ArtifactError, match="unsigned"):
        load(upath, key=upub)
    rel = load(upath, allow_unsigned=True)
    assert not rel.verified


def test_bad_body_rejected():
    s = make_summary("linear")
    body = {"format": "dpsummary.release/v1", "summary": s.to_dict(), "feature_names": ["a", "b", "c", "d"]}
    rel = Release.from_body(body, CLAIM)
    assert rel.param_names == ["intercept", "a", "b", "c", "d", "log_sigma"]  # issue 51: sigma estimated
    assert rel.parameter_names == rel.param_names
    with pytest.raises(ReleaseFormatError):
        Release.from_body({**body, "format": "other"})
    with pytest.raises(ReleaseFormatError):
        Release.from_body({**body, "param_names": ["x"]})
    neg = s.to_dict()
    neg["weights"][0] = -1.0
    with pytest.raises(ReleaseFormatError, match="non-negative"):
        Release.from_body({**body, "summary": neg})
    nan = s.to_dict()
    nan["points"][0][0] = math.nan
    with pytest.raises(ReleaseFormatError, match="finite"):
        Release.from_body({**body, "summary": nan})


@pytest.mark.parametrize(("name", "spec"), [FAMILIES[0]])
def test_exact_laplace_and_nuts_agree_for_conjugate_models(name, spec):
    rel = Release.from_summary(make_summary(name, **spec))
    post = rel.model.exact_posterior(*rel.nonzero())
    exact = rel.sample(20000, seed=1, method="exact")
    assert isinstance(exact, np.ndarray) and exact.dtype == np.float64 and exact.shape == (20000, rel.dim)
    sd = np.sqrt(np.diagonal(post.cov.numpy()))
    mean = post.mean.numpy()
    assert np.all(np.abs(exact.mean(0) - mean) < 5 * sd / math.sqrt(20000))
    lap = rel.sample(10, seed=1, method="laplace")
    assert lap.shape == (10, rel.dim)
    assert torch.allclose(rel.posterior_mode(), post.mean)
    draws = rel.sample(2000, seed=2, method="nuts", chains=2, num_warmup=300, return_draws=True)
    assert draws.values.shape == (2, 1000, rel.dim)
    ess = draws.diagnostics.ess_bulk
    assert np.all(ess > 400) and draws.diagnostics.divergences == 0 and np.all(draws.diagnostics.rhat < 1.01)
    flat = draws.flat()
    # 5 Monte Carlo standard errors: fails with probability below 1e-5 per coordinate.
    assert np.all(np.abs(flat.mean(0) - mean) < 5 * sd / np.sqrt(ess))
    np.testing.assert_allclose(flat.std(0), sd, rtol=0.1)
    # same seed, same draws
    np.testing.assert_array_equal(rel.sample(5, seed=3, method="exact"), rel.sample(5, seed=3, method="exact"))
    np.testing.assert_array_equal(rel.sample(8, seed=4, method="nuts", chains=2, num_warmup=100),
                                  rel.sample(8, seed=4, method="nuts", chains=2, num_warmup=100))


def test_sample_method_errors():
    rel = Release.from_summary(make_summary("logistic"))
    with pytest.raises(ValueError, match="no exact posterior"):
        rel.sample(10, method="exact")
    with pytest.raises(ValueError, match="unknown method"):
        rel.sample(10, method="gibbs")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="replaced by method='nuts'"):
        rel.sample(10, method="hmc")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="num_warmup"):
        rel.sample(10, num_warmup=10)
    with pytest.raises(ValueError, match="method='nuts'"):
        rel.sample(10, method="laplace", return_draws=True)


def test_laplace_warns_when_narrower_than_the_signed_gaussian():
    """sample(method="laplace") says when the pseudocoreset posterior's mode Gaussian is narrower
    than the Gaussian the release signs (issue 50: the Laplace intervals missed where the draws
    did not); a signed Gaussian equal to the Laplace gives no warning."""
    from dpsummary.analyst import LAPLACE_NARROW_RATIO
    from dpsummary.metrics import summary_posterior
    from dpsummary.sampling import SamplingWarning

    summary = make_summary("logistic")
    laplace = summary_posterior(summary.model, summary.points, summary.weights)

    def with_signed(sd_factor: float) -> Release:
        cov = laplace.cov * sd_factor**2
        body = {"posterior": {"default": "noise_aware",
                              "gaussians": {"noise_aware": {"mean": laplace.mean.tolist(), "cov": cov.tolist()}}}}
        return Release.from_summary(summary, body=body)

    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", SamplingWarning)
        with_signed(1.0).sample(5, seed=0, method="laplace")
        with_signed(1.0 / (LAPLACE_NARROW_RATIO + 0.01)).sample(5, seed=0, method="laplace")
    with pytest.warns(SamplingWarning, match=r"narrower than the release's posterior \(\w+: sd 0\.80x"):
        draws = with_signed(1.25).sample(5, seed=0, method="laplace")
    assert draws.shape == (5, laplace.mean.shape[0])


def test_posterior_predictive_and_raw_rows():
    tr = Transform.from_schema(SCHEMA)
    summary = make_summary("logistic", k=tr.num_features, transform=tr.to_dict())
    rel = Release.from_summary(summary, claim=CLAIM)
    assert rel.feature_names == ["age", "job=a", "job=b", "job=c"]
    assert rel.param_names == ["intercept", "age", "job=a", "job=b", "job=c"]
    rows = [{"age": "49", "job": "b"}, {"age": "80", "job": "c", "y": "yes"}]
    x, y = rel.map_rows([{**rows[0], "y": "no"}, rows[1]])
    np.testing.assert_allclose(x.numpy(), [[0.0, 0, 1, 0], [1.0, 0, 0, 1]])
    assert y is not None and y.tolist() == [0.0, 1.0]
    assert rel.map_rows(rows[:1])[1] is None
    draws = rel.sample(50, seed=0, method="laplace")
    p = rel.posterior_predictive(rows, draws)
    # numpy float64, like sample()'s draws
    assert isinstance(p, np.ndarray) and p.dtype == np.float64
    assert p.shape == (50, 2) and np.all((p > 0) & (p < 1))
    th = torch.as_tensor(draws)
    eta = th[:, 0] + th[:, 1:] @ x[1]
    np.testing.assert_allclose(p[:, 1], torch.sigmoid(eta).numpy())
    # same from model-space features, torch draws
    p2 = rel.posterior_predictive(x.numpy(), th)
    np.testing.assert_allclose(p, p2)
    sim = rel.posterior_predictive(x, draws, kind="sample", seed=0)
    assert set(np.unique(sim).tolist()) <= {0.0, 1.0}
    np.testing.assert_array_equal(sim, rel.posterior_predictive(x, draws, kind="sample", seed=0))
    full = torch.cat([x, torch.tensor([[0.3], [1.0]], dtype=DTYPE)], 1)
    ll = rel.posterior_predictive(full, draws, kind="log_likelihood")
    assert ll.shape == (50, 2)
    np.testing.assert_allclose(ll, rel.model.log_likelihood(full, draws).T.numpy())
    with pytest.raises(ValueError, match="target"):
        rel.posterior_predictive(x, draws, kind="log_likelihood")


def test_posterior_predictive_other_families():
    draws = torch.zeros(7, 5, dtype=DTYPE)
    rel = Release.from_summary(make_summary("poisson"))
    np.testing.assert_allclose(rel.posterior_predictive(np.zeros((3, 4)), draws), np.ones((7, 3)))
    rel = Release.from_summary(make_summary("linear", noise_scale=0.5))
    assert rel.posterior_predictive(np.zeros((3, 4)), draws, kind="sample", seed=0).shape == (7, 3)
    rel = Release.from_summary(make_summary("gaussian_mean"))
    d4 = torch.ones(7, 4, dtype=DTYPE)
    np.testing.assert_array_equal(rel.posterior_predictive(3, d4), np.ones((7, 3, 4)))
    assert rel.posterior_predictive(np.zeros((2, 4)), d4, kind="log_likelihood").shape == (7, 2)


def test_cli_export(tmp_path):
    from typer.testing import CliRunner

    import dpsummary.cli.export  # noqa: F401  (registers the command)
    from dpsummary.cli import app

    path, pub = make_artifact(tmp_path, make_summary("logistic"))
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["export", str(path), "--to", "json", "--out", str(out), "--key", str(pub)])
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "release.json").read_text())
    assert doc["format"] == "dpsummary.neutral/v1" and doc["privacy"]["verified"]
    assert (out / "reference.py").exists()
    data = bytearray(path.read_bytes())
    data[200] ^= 0x01
    bad = tmp_path / "bad.json"
    bad.write_bytes(bytes(data))
    res = CliRunner().invoke(app, ["export", str(bad), "--to", "stan", "--out", str(tmp_path / "o2"), "--key", str(pub)])
    assert res.exit_code != 0 and "error:" in res.output
    assert not (tmp_path / "o2").exists()


# --------------------------------------------------------------------------- BNN releases
def _bnn_release(info: dict | None = None) -> Release:
    from dpsummary.models.bnn import BNN

    model = BNN(2, widths=(3,))
    g = torch.Generator().manual_seed(0)
    theta = model.sample_prior(1, g)[0]
    pts = model.simulate(theta, 40, g)
    return Release.from_summary(Summary(pts, torch.full((40,), 5.0, dtype=DTYPE), model, "dp-bb-psvi",
                                        info=info or {}))


def test_bnn_vi_sampler_fits_the_weighted_posterior_and_predicts():
    """VI on the weighted pseudodata raises the ELBO's data term: the fitted mean explains the
    points better than the prior draws do; predictions are probabilities; deterministic."""
    rel = _bnn_release()
    mu, sd = rel.fit_variational(steps=300, seed=1)
    assert mu.shape == sd.shape == (rel.dim,) and bool((sd > 0).all())
    fitted = float(rel.log_density(mu))
    prior = rel.log_density(rel.model.sample_prior(50, torch.Generator().manual_seed(2)))
    assert fitted > float(prior.max())
    draws = rel.sample(30, seed=3, vi_steps=100)
    np.testing.assert_array_equal(draws, rel.sample(30, seed=3, vi_steps=100))
    p = rel.posterior_predictive(np.zeros((4, 2)), draws)
    assert p.shape == (30, 4) and bool(((p >= 0) & (p <= 1)).all())
    # A released variational posterior is the starting point: zero VI steps return it.
    start = {"variational": {"mu": mu.tolist(), "rho": torch.log(torch.expm1(sd)).tolist()}}
    mu0, sd0 = _bnn_release(start).fit_variational(steps=0)
    torch.testing.assert_close(mu0, mu)
    torch.testing.assert_close(sd0, sd)


def test_vi_method_is_for_bnn_only_and_laplace_refuses_bnn():
    with pytest.raises(ValueError, match="BNN"):
        Release.from_summary(make_summary("logistic")).sample(5, method="vi")
    with pytest.raises(ValueError, match="vi"):
        _bnn_release().sample(5, method="laplace")


def test_linear_release_with_known_noise_keeps_its_gaussian_posterior():
    """An artifact written before issue 51 (noise_scale declared, no log_sigma) still loads; its
    posterior is Gaussian, so the exact moments, the Laplace mode and NUTS agree."""
    rel = Release.from_summary(make_summary("linear", noise_scale=0.5, prior_scale=1.5))
    assert rel.param_names[-1] != "log_sigma" and not rel.model.estimates_sigma
    post = rel.model.exact_posterior(*rel.nonzero())
    assert torch.allclose(rel.posterior_mode(), post.mean, atol=1e-8)
    flat = rel.sample(2000, seed=2, method="nuts", chains=2, num_warmup=300)
    sd = np.sqrt(np.diagonal(post.cov.numpy()))
    np.testing.assert_allclose(flat.std(0), sd, rtol=0.15)  # 2,000 draws: an sd within 15% fails ~never
