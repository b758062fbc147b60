"""An S3 client for the end-to-end tests that is not ours: boto3 (and pyarrow for Parquet).

The tests run it through the wrappers of tests/s3_harness.rs, with the store's endpoint and
credentials in the environment (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
AWS_REGION; AWS_MAX_ATTEMPTS=1 turns boto3's retries off). Path-style addressing throughout.

Usage:
  s3_read.py create-bucket BUCKET
  s3_read.py list BUCKET            one JSON object: {"objects": [{"key", "size"}],
                                    "uploads": [{"key", "upload_id"}]} (multipart uploads in
                                    progress)
  s3_read.py get BUCKET KEY         the object's bytes, as stored, to standard output
  s3_read.py dump BUCKET PREFIX --format text|json|parquet
                                    every object under PREFIX in key order, decompressed
                                    (gzip members, zstd frames: by magic number, which a
                                    .gz or .zst suffix must agree with), one JSON line per
                                    text line {"key", "line"}, per JSON record or Parquet row
                                    {"key", "record"}
  s3_read.py probe BUCKET           one ListObjectsV2 with short timeouts; one JSON object:
                                    {"ok": true}, {"status", "code"} for an error answer, or
                                    {"connection_error": "..."}
"""

import argparse
import base64
import datetime
import decimal
import gzip
import io
import json
import os
import sys

import boto3
import botocore.config
import botocore.exceptions

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def client(timeouts=None):
    options = {"s3": {"addressing_style": "path"}}
    if timeouts is not None:
        options["connect_timeout"], options["read_timeout"] = timeouts
    return boto3.client("s3", config=botocore.config.Config(**options))


def keys_and_sizes(s3, bucket, prefix=""):
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return [(o["Key"], o["Size"]) for page in pages for o in page.get("Contents", [])]


def uploads(s3, bucket):
    pages = s3.get_paginator("list_multipart_uploads").paginate(Bucket=bucket)
    return [
        {"key": u["Key"], "upload_id": u["UploadId"]}
        for page in pages
        for u in page.get("Uploads", [])
    ]


def decompress(key, data):
    """The content of an object: gzip members or zstd frames are decoded, whatever their
    number; a suffix that promises a compression the bytes do not have is an error."""
    if data.startswith(GZIP_MAGIC):
        return gzip.decompress(data)
    if data.startswith(ZSTD_MAGIC):
        import zstandard

        reader = zstandard.ZstdDecompressor().stream_reader(
            io.BytesIO(data), read_across_frames=True
        )
        return reader.read()
    if key.endswith((".gz", ".zst")):
        raise SystemExit(f"{key}: named as compressed, but its bytes are not gzip nor zstd")
    return data


def json_value(value):
    """A Parquet value JSON cannot hold as it is."""
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return {"base64": base64.b64encode(value).decode("ascii")}
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, (decimal.Decimal, datetime.timedelta)):
        return str(value)
    raise TypeError(f"cannot print a {type(value).__name__} as JSON")


def records(key, content, fmt):
    if fmt == "text":
        for line in content.decode("utf-8").splitlines():
            yield {"key": key, "line": line}
    elif fmt == "json":
        text = content.decode("utf-8")
        if text.lstrip().startswith("["):
            values = json.loads(text)
        else:
            values = [json.loads(line) for line in text.splitlines() if line.strip()]
        for value in values:
            yield {"key": key, "record": value}
    else:
        import pyarrow
        import pyarrow.parquet

        # Arrow's thread pools can abort or hang the interpreter's exit after a read (apache/arrow
        # issues 34314 and 50482), more often through a Python file object or with threads: an
        # Arrow buffer, one thread, and `main` ends the process without the teardown.
        table = pyarrow.parquet.read_table(pyarrow.BufferReader(content), use_threads=False)
        for row in table.to_pylist():
            yield {"key": key, "record": row}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("create-bucket").add_argument("bucket")
    commands.add_parser("list").add_argument("bucket")
    get = commands.add_parser("get")
    get.add_argument("bucket")
    get.add_argument("key")
    dump = commands.add_parser("dump")
    dump.add_argument("bucket")
    dump.add_argument("prefix")
    dump.add_argument("--format", choices=["text", "json", "parquet"], required=True)
    commands.add_parser("probe").add_argument("bucket")
    args = parser.parse_args()

    if args.command == "create-bucket":
        client().create_bucket(Bucket=args.bucket)
    elif args.command == "list":
        s3 = client()
        objects = [{"key": k, "size": s} for k, s in keys_and_sizes(s3, args.bucket)]
        print(json.dumps({"objects": objects, "uploads": uploads(s3, args.bucket)}))
    elif args.command == "get":
        body = client().get_object(Bucket=args.bucket, Key=args.key)["Body"].read()
        sys.stdout.buffer.write(body)
    elif args.command == "dump":
        s3 = client()
        for key, _ in sorted(keys_and_sizes(s3, args.bucket, args.prefix)):
            data = s3.get_object(Bucket=args.bucket, Key=key)["Body"].read()
            for record in records(key, decompress(key, data), args.format):
                print(json.dumps(record, default=json_value))
    else:
        try:
            client(timeouts=(5, 5)).list_objects_v2(Bucket=args.bucket, MaxKeys=1)
            outcome = {"ok": True}
        except botocore.exceptions.ClientError as e:
            outcome = {
                "status": e.response["ResponseMetadata"]["HTTPStatusCode"],
                "code": e.response["Error"]["Code"],
            }
        except (botocore.exceptions.ConnectionError, botocore.exceptions.HTTPClientError) as e:
            outcome = {"connection_error": str(e)}
        print(json.dumps(outcome))


if __name__ == "__main__":
    main()
    if "pyarrow" in sys.modules:
        # See `records`: everything is printed; the interpreter's teardown is skipped.
        sys.stdout.flush()
        os._exit(0)
