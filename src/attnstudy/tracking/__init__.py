"""MLflow tracking: the only package of attnstudy (with :mod:`attnstudy.serving.pyfunc`) that
imports mlflow.

* :mod:`.client` — :class:`Tracker`, the thin client every store call goes through;
* :mod:`.schema` — run kinds, tag names, artifact paths and :class:`RunRecord`, named once;
* :mod:`.store` — the study store: writing studies and finding their runs again;
* :mod:`.models` — model packaging, registration and model URIs.
"""

from .client import (
    DeletedError,
    ModelNotFoundError,
    StoreNotFoundError,
    StoreReadOnlyError,
    Tracker,
    TrackingError,
    UnfinishedRunError,
    check_server,
    resolve_timeout,
)
from .schema import Artifact, Kind, Role, RunRecord, Tag

__all__ = [
    "Artifact",
    "DeletedError",
    "Kind",
    "ModelNotFoundError",
    "Role",
    "RunRecord",
    "StoreNotFoundError",
    "StoreReadOnlyError",
    "Tag",
    "Tracker",
    "TrackingError",
    "UnfinishedRunError",
    "check_server",
    "resolve_timeout",
]
