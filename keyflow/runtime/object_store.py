"""The ``s3.*`` options in every process that opens a checkpoint: the driver's environment, and
through the SparkContext's environment every Spark Python worker's, on any host."""

from __future__ import annotations

import os

from pyarrow import fs
from pyspark import SparkContext

from keyflow.config import Config
from keyflow.errors import ExternalSystemError
from keyflow.s3 import ENVIRONMENT
from keyflow.state.checkpoint import Checkpoint

# Also the AWS SDK's own variables, where the driver has them: executors on other hosts do not.
SHARED = (*ENVIRONMENT.values(), "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION",
          "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")  # fmt: skip
_exported: dict[str, str] = {}  # what the last export set, so a later run without s3.* options drops it


def export(config: Config) -> None:
    """Put the pipeline's ``s3.*`` options into this process's environment (before anything
    opens the checkpoint); without any, the environment's own settings apply."""
    for name, value in _exported.items():
        if os.environ.get(name) == value:
            del os.environ[name]
    settings = config.s3_settings()
    _exported.clear()
    if settings is not None:
        for name in ENVIRONMENT.values():
            os.environ.pop(name, None)
        _exported.update(settings.environment())
        os.environ.update(_exported)


def opened(uri: str) -> Checkpoint:
    """The checkpoint at ``uri``; on AWS with no region set, the bucket's region found here once
    and exported (each worker would look it up again), or an error saying to set it."""
    try:
        checkpoint = Checkpoint(uri)
    except OSError as error:
        raise ExternalSystemError(
            f"cannot open checkpoint {uri}: {str(error).strip()}; set s3.endpoint.region (or s3.endpoint for a store "
            "other than AWS)"
        ) from None
    if isinstance(checkpoint.fs, fs.S3FileSystem) and not os.environ.get(ENVIRONMENT["region"]):
        _exported[ENVIRONMENT["region"]] = os.environ[ENVIRONMENT["region"]] = checkpoint.fs.region
    return checkpoint


def share_with_workers(context: SparkContext, needed: bool) -> None:
    """Python workers started from now on get the driver's store settings if ``needed`` (the
    checkpoint is on an object store; otherwise no credential leaves the driver). A running
    worker keeps its environment: Spark starts workers per distinct environment."""
    for name in SHARED:
        if needed and name in os.environ:
            context.environment[name] = os.environ[name]
        else:
            context.environment.pop(name, None)
