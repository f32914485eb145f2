"""S3-compatible object stores (AWS S3, MinIO, Ceph, ...) through PyArrow's ``S3FileSystem``.

The pipeline's ``s3.*`` options (Flink's names, read as Flink's S3 filesystems read them) are
exported to the environment as ``KEYFLOW_S3_*`` variables: the driver and every Spark Python
worker, on any host, build the same filesystem from them. Unset options fall back to the AWS
SDK's own environment (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_REGION``, ...).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from pyarrow import fs

ENVIRONMENT = {
    "endpoint": "KEYFLOW_S3_ENDPOINT",
    "region": "KEYFLOW_S3_REGION",
    "access_key": "KEYFLOW_S3_ACCESS_KEY",
    "secret_key": "KEYFLOW_S3_SECRET_KEY",  # 'SECRET' in the name: Spark's UI redacts its value
    "retries": "KEYFLOW_S3_RETRIES",
    "connect_timeout": "KEYFLOW_S3_CONNECT_TIMEOUT",
    "request_timeout": "KEYFLOW_S3_REQUEST_TIMEOUT",
}
DEFAULT_RETRIES = 5  # Hadoop's fs.s3a.attempts.maximum (retries after the first try), Flink's s3.attempts.maximum
DEFAULT_CONNECT_TIMEOUT = 30.0  # Hadoop 3.4's fs.s3a.connection.establish.timeout
DEFAULT_REQUEST_TIMEOUT = 60.0  # no data for this long fails a try (Hadoop's fs.s3a.connection.timeout: 200 s)

ENDPOINT = re.compile(r"(?:(https?)://)?([A-Za-z0-9.\-\[\]:]+?)/?")


@dataclass(frozen=True)
class S3Settings:
    """How to reach the store: ``endpoint`` None is AWS (or ``AWS_ENDPOINT_URL``); credentials
    None are the AWS SDK's chain (environment, profile, instance role)."""

    endpoint: str | None = None
    region: str | None = None
    access_key: str | None = None
    secret_key: str | None = None
    retries: int = DEFAULT_RETRIES
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT

    def environment(self) -> dict[str, str]:
        """The variables that carry these settings to other processes (set ones only)."""
        values = {name: getattr(self, name) for name in ENVIRONMENT}
        return {ENVIRONMENT[name]: str(value) for name, value in values.items() if value is not None}

    @staticmethod
    def from_environment(environ: Mapping[str, str] = os.environ) -> S3Settings:
        def given(name: str) -> str | None:
            return environ.get(ENVIRONMENT[name]) or None

        # PyArrow's S3FileSystem reads credentials from the AWS SDK's environment, not the endpoint or region.
        endpoint = given("endpoint") or environ.get("AWS_ENDPOINT_URL_S3") or environ.get("AWS_ENDPOINT_URL")
        region = given("region") or environ.get("AWS_REGION") or environ.get("AWS_DEFAULT_REGION")
        return S3Settings(
            endpoint or None, region or None, given("access_key"), given("secret_key"),
            int(given("retries") or DEFAULT_RETRIES),
            float(given("connect_timeout") or DEFAULT_CONNECT_TIMEOUT),
            float(given("request_timeout") or DEFAULT_REQUEST_TIMEOUT),
        )  # fmt: skip

    def for_bucket(self, bucket: str) -> S3Settings:
        """On AWS with no region given, the bucket's own region (as PyArrow finds it for an
        ``s3://`` URI): requests to another region's bucket would be redirected and fail."""
        if self.endpoint is None and self.region is None:
            return dataclasses.replace(self, region=_bucket_region(bucket))
        return self

    def described(self) -> str:
        """Where requests go, for error messages (never the credentials)."""
        return f"endpoint {self.endpoint}" if self.endpoint else "AWS S3 (no s3.endpoint set)"


def split_endpoint(endpoint: str) -> tuple[str, str]:
    """``http://host:9000`` -> (``host:9000``, ``http``); a bare ``host[:port]`` is https, as
    Hadoop's S3A reads ``fs.s3a.endpoint``. Raises ValueError for anything else."""
    match = ENDPOINT.fullmatch(endpoint.strip())
    if match is None:
        raise ValueError(endpoint)
    return match.group(2), match.group(1) or "https"


def filesystem(settings: S3Settings) -> fs.S3FileSystem:
    """The filesystem for ``settings``; one per process and settings (each holds a client)."""
    return _filesystem(settings)


@functools.cache
def _bucket_region(bucket: str) -> str:
    return str(fs.resolve_s3_region(bucket))


@functools.cache
def _filesystem(settings: S3Settings) -> fs.S3FileSystem:
    endpoint, scheme = split_endpoint(settings.endpoint) if settings.endpoint else (None, "https")
    return fs.S3FileSystem(
        access_key=settings.access_key,
        secret_key=settings.secret_key,
        region=settings.region,
        endpoint_override=endpoint,
        scheme=scheme,
        connect_timeout=settings.connect_timeout,
        request_timeout=settings.request_timeout,  # curl's low-speed time: no data this long fails the try
        # The AWS SDK's default strategy: throttling, 5xx, connection errors and timeouts are
        # retried with exponential backoff, ``retries`` times after the first try. (The standard
        # strategy draws on a retry quota that Arrow never refills: a long-running driver would
        # stop retrying after ~100 retries.)
        retry_strategy=fs.AwsDefaultS3RetryStrategy(max_attempts=settings.retries),
    )
