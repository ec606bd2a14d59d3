"""Fixtures: the real servers on port 0, a generated model, certificates.

The binaries come from the environment (ctest sets them): KVTIER_CACHE_BINARY,
KVTIER_DECODE_BINARY, KVTIER_PREFILL_BINARY, KVTIER_BINARY (the CLI) and
KVTIER_WIRE_VECTORS.
"""
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import threading

import pytest


def binary(name):
    path = os.environ.get(name)
    if not path:
        pytest.skip(f"{name} is not set (run through ctest)")
    return path


class Server:
    """A server process; `target` is the HOST:PORT it printed."""

    def __init__(self, argv):
        self.argv = argv
        self.process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.stderr = []
        threading.Thread(target=self._drain_stderr, daemon=True).start()
        self.target = None
        for line in self.process.stdout:
            if line.startswith("listening on "):
                self.target = line.split()[-1]
                break
        if self.target is None:
            self.process.wait(timeout=30)
            raise RuntimeError(f"{argv[0]} did not start: {''.join(self.stderr)}")
        threading.Thread(target=self.process.stdout.read, daemon=True).start()

    def _drain_stderr(self):
        for line in self.process.stderr:
            self.stderr.append(line)

    def stop(self):
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def pip_install_copy(tmp_path, **env):
    """pip installs a copy of clients/python made outside the checkout (as
    from an sdist) into tmp_path/site, with `env` added to this process's;
    returns that folder and run(script): the script's stdout, run from
    tmp_path with only that install on the path."""
    source = pathlib.Path(__file__).resolve().parents[1]
    copy = tmp_path / "src"
    shutil.copytree(source, copy, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info", "tests"))
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "--no-index",
                    "--target", str(target), str(copy)], check=True, capture_output=True,
                   env=dict(os.environ, KVTIER_SOURCE_DIR=str(source.parents[1]), **env))

    def run(script):
        return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path,
                              env=dict(os.environ, PYTHONPATH=str(target)), check=True).stdout
    return target, run


@pytest.fixture
def start_server():
    started = []

    def start(argv):
        server = Server([str(a) for a in argv])
        started.append(server)
        return server

    yield start
    for server in reversed(started):
        server.stop()


def cache_argv(*extra):
    return [binary("KVTIER_CACHE_BINARY"), "--listen", "127.0.0.1:0", "--metrics-listen", "", "--device-capacity",
            "32MiB", "--host-capacity", "32MiB", *extra]


@pytest.fixture
def cache(start_server):
    """A plaintext kvtier-cache serving any namespace."""
    return start_server(cache_argv())


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    """A generated DeepSeek-V2 checkpoint (the tiny preset)."""
    out = tmp_path_factory.mktemp("model")
    subprocess.run([binary("KVTIER_BINARY"), "make-model", "--preset", "tiny", "--out", str(out), "--seed", "29"],
                   check=True, capture_output=True)
    return out


@pytest.fixture(scope="session")
def v3_model_dir(tmp_path_factory):
    """A generated DeepSeek-V3-family checkpoint (the v3-tiny preset: FP8
    weights, the noaux_tc router, 3 shards, an MTP layer)."""
    out = tmp_path_factory.mktemp("v3_model")
    subprocess.run([binary("KVTIER_BINARY"), "make-model", "--preset", "v3-tiny", "--out", str(out), "--seed", "31"],
                   check=True, capture_output=True)
    return out


def sh(*args, cwd):
    subprocess.run(args, cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="session")
def tls_dir(tmp_path_factory):
    """A CA and a server certificate for localhost, made with openssl: the
    server's --tls-dir; its ca.crt alone is what a client trusts."""
    d = tmp_path_factory.mktemp("tls")
    p256 = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    sh("openssl", "req", "-x509", *p256, "-days", "1", "-subj", "/CN=test CA", "-keyout", "ca.key", "-out", "ca.crt",
       cwd=d)
    sh("openssl", "req", *p256, "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
       "-keyout", "tls.key", "-out", "tls.csr", cwd=d)
    sh("openssl", "x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-days",
       "1", "-copy_extensions", "copy", "-out", "tls.crt", cwd=d)
    client = d / "client"
    client.mkdir()
    (client / "ca.crt").write_bytes((d / "ca.crt").read_bytes())
    return d


def write_tenants(path, tenants):
    """tenants: {name: (role, [namespaces], token or [tokens])} as a
    --tenants file, written by a rename (a server may be reading it)."""
    def hashes(tokens):
        return [hashlib.sha256(t.encode()).hexdigest() for t in ([tokens] if isinstance(tokens, str) else tokens)]
    new = path.with_name(path.name + ".new")
    new.write_text(json.dumps({"tenants": [
        {"name": name, "role": role, "namespaces": namespaces, "tokenSha256": hashes(tokens)}
        for name, (role, namespaces, tokens) in tenants.items()]}))
    new.rename(path)
    return path
