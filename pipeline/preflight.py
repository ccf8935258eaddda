"""Checks against the services a job will use, made before it starts anything (no Ray, no MLflow run, no data
generated): each answers in one line (ConfigError) what a job would otherwise fail on minutes later."""

from __future__ import annotations

from pipeline.config import ConfigError


def check_server(uri: str, experiment: str) -> None:
    """A tracking server (http:// or https://) answers with our login, else ConfigError in one line. Asked once,
    without MLflow's retries, which would spend minutes on a server that is down or a login it refuses. The login
    is MLflow's own: MLFLOW_TRACKING_USERNAME / _PASSWORD, else ~/.mlflow/credentials."""
    if not uri.startswith(("http://", "https://")):
        return
    import requests
    from mlflow.utils.credentials import read_mlflow_creds

    creds = read_mlflow_creds()
    login = (creds.username, creds.password) if creds.username and creds.password else None
    try:
        r = requests.get(
            f"{uri.rstrip('/')}/api/2.0/mlflow/experiments/get-by-name",
            params={"experiment_name": experiment},
            auth=login,
            timeout=30,
        )
    except requests.RequestException as e:
        raise ConfigError(f"tracking.uri={uri}: the MLflow server cannot be reached ({type(e).__name__})") from None
    if r.status_code in (401, 403):
        why = "refused the login" if login else "asks for a login and none is set"
        raise ConfigError(
            f"tracking.uri={uri}: the MLflow server {why} (HTTP {r.status_code}); set MLFLOW_TRACKING_USERNAME and "
            f"MLFLOW_TRACKING_PASSWORD, or put them in ~/.mlflow/credentials"
        )
    if r.status_code >= 500:
        raise ConfigError(f"tracking.uri={uri}: the MLflow server answered HTTP {r.status_code}")
