# snakebox's HTTP service in a container, built from source:
#   docker build -t snakebox .
#   docker run --rm -v snakebox-data:/var/lib/snakebox snakebox keys add --tenant me
#   docker run -d --name snakebox -p 127.0.0.1:8000:8000 -v snakebox-data:/var/lib/snakebox \
#     --security-opt seccomp=unconfined --security-opt apparmor=unconfined \
#     --security-opt systempaths=unconfined snakebox
# Runs go into bubblewrap sandboxes inside the container, which needs user namespaces and a
# fresh /proc there: hence the three --security-opt (README, "Install": "Docker", says what
# they cost). The server runs as the unprivileged user `snakebox`. Python is the image's
# (Debian 12: 3.11); uv downloads no interpreters. Sessions' disk shares are bounded while
# calls run by fuse2fs when the container also gets `--device /dev/fuse`; without it they are
# checked between calls only (check_environment says which).
ARG RUST_IMAGE=rust:1-bookworm
ARG BASE_IMAGE=debian:bookworm-slim

FROM ${RUST_IMAGE} AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p snakebox \
    && install -m 0755 target/release/snakebox /snakebox

FROM ${BASE_IMAGE}
# bubblewrap for the sandboxes, fuse2fs for the sessions' disk, Python for the scripts, a
# venv for uv (from PyPI).
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        bubblewrap ca-certificates fuse2fs python3 python3-venv \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/uv \
    && /opt/uv/bin/python -m pip install --no-cache-dir --disable-pip-version-check uv \
    && ln -s /opt/uv/bin/uv /usr/local/bin/uv \
    && useradd --system --user-group --home-dir /var/lib/snakebox --create-home \
        --shell /usr/sbin/nologin snakebox
COPY --from=build /snakebox /usr/local/bin/snakebox
USER snakebox
ENV SNAKEBOX_DATA_DIR=/var/lib/snakebox
VOLUME /var/lib/snakebox
EXPOSE 8000
# Bound to every address of the container, so it starts only once an API key exists
# (`snakebox keys add`, above). /readyz needs none: 503 (unhealthy) while runs would be
# refused, e.g. when the sandbox cannot start for want of the --security-opt above.
# Port 8000: change it here too if CMD binds another.
HEALTHCHECK CMD ["python3", "-c", "import urllib.request as u; u.urlopen('http://127.0.0.1:8000/readyz', timeout=5)"]
ENTRYPOINT ["snakebox"]
CMD ["serve", "--http", "0.0.0.0:8000"]
