"""What the cloud tests ask of the emulators beyond object_store's API
(Python's standard library only):

  emulators.py gcs-upload ENDPOINT BUCKET PREFIX DIR
      fake-gcs-server: create BUCKET, then upload every file of DIR as
      PREFIX/REL through the JSON API (fake-gcs-server does not take
      object_store's XML API uploads).
  emulators.py gcs-put ENDPOINT BUCKET KEY FILE
      fake-gcs-server: upload FILE as KEY (a new version of the object).
  emulators.py azure-container ENDPOINT ACCOUNT KEY CONTAINER
      Azurite: create CONTAINER (Create Container, signed with the
      account's shared key; object_store has no call for it).
"""
import base64
import email.utils
import hashlib
import hmac
import os
import sys
import urllib.parse
import urllib.request


def gcs_upload(endpoint, bucket, prefix, root):
    req = urllib.request.Request(
        f"{endpoint}/storage/v1/b?project=granary",
        data=('{"name": "%s"}' % bucket).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    urllib.request.urlopen(req).read()
    n = 0
    for dirpath, dirs, files in os.walk(root):
        # Hidden names are skipped, as the catalogs skip them.
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for f in files:
            if f.startswith("."):
                continue
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, root).replace(os.sep, "/")
            name = f"{prefix}/{rel}" if prefix else rel
            gcs_put(endpoint, bucket, name, path)
            n += 1
    print(n)


def gcs_put(endpoint, bucket, name, path):
    with open(path, "rb") as fh:
        body = fh.read()
    url = (
        f"{endpoint}/upload/storage/v1/b/{bucket}/o?uploadType=media&name="
        + urllib.parse.quote(name, safe="")
    )
    req = urllib.request.Request(
        url,
        data=body,
        headers={"Content-Type": "application/octet-stream"},
        method="POST",
    )
    urllib.request.urlopen(req).read()


def azure_container(endpoint, account, key, container):
    url = f"{endpoint}/{container}?restype=container"
    path = urllib.parse.urlparse(url).path
    date = email.utils.formatdate(usegmt=True)
    version = "2021-08-06"
    to_sign = "\n".join(
        # VERB, Content-Encoding, -Language, -Length (empty for 0), -MD5,
        # -Type, Date, If-Modified-Since, If-Match, If-None-Match,
        # If-Unmodified-Since, Range
        ["PUT", "", "", "", "", "application/octet-stream", "", "", "", "", "", ""]
        + [f"x-ms-date:{date}", f"x-ms-version:{version}"]
        + [f"/{account}{path}\nrestype:container"]
    )
    sig = base64.b64encode(
        hmac.new(base64.b64decode(key), to_sign.encode(), hashlib.sha256).digest()
    ).decode()
    req = urllib.request.Request(
        url,
        data=b"",
        headers={
            "x-ms-date": date,
            "x-ms-version": version,
            "Content-Type": "application/octet-stream",
            "Authorization": f"SharedKey {account}:{sig}",
        },
        method="PUT",
    )
    urllib.request.urlopen(req).read()


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    {"gcs-upload": gcs_upload, "gcs-put": gcs_put, "azure-container": azure_container}[cmd](*args)
