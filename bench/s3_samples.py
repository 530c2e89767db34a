"""The samples of the boto3 loaders of `bench/run latency` and `bench/run
stall`: the keys file they read and the S3 client each worker uses."""

import os


def read_keys(path):
    """KEYS.tsv, one `key<TAB>size` line per sample: (keys, sizes)."""
    keys, sizes = [], []
    with open(path) as f:
        for line in f:
            k, s = line.rstrip("\n").split("\t")
            keys.append(k)
            sizes.append(int(s))
    return keys, sizes


class ProcessClient:
    """A boto3 S3 client for `endpoint` (path-style addressing, botocore's
    standard retries, `pool` connections), made again in every process:
    boto3 clients must not cross a fork."""

    def __init__(self, endpoint, pool):
        self.endpoint, self.pool = endpoint, pool
        self._client = None
        self._pid = None

    def get(self):
        if self._client is None or self._pid != os.getpid():
            import boto3
            from botocore.config import Config

            self._client = boto3.session.Session().client(
                "s3",
                endpoint_url=self.endpoint,
                config=Config(
                    s3={"addressing_style": "path"},
                    retries={"max_attempts": 5, "mode": "standard"},
                    max_pool_connections=self.pool,
                ),
            )
            self._pid = os.getpid()
        return self._client
