# One image for every toolq process; docker-compose.yml picks the command.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Extras of the toolq package, and packages to install beside it (Flower, for its profile).
ARG TOOLQ_EXTRAS=api
ARG EXTRA_PACKAGES=""

RUN groupadd --system --gid 10001 toolq \
 && useradd --system --uid 10001 --gid toolq --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin toolq

# Built from a copy that is then removed: at run time toolq is only in
# site-packages, so `celery -A` (which puts the working directory on sys.path)
# cannot pick up a second copy of the sources.
COPY . /src
RUN pip install "/src[${TOOLQ_EXTRAS}]" ${EXTRA_PACKAGES} \
 && rm -rf /src

WORKDIR /app
USER toolq:toolq
ENV TOOLQ_APP=toolq.examples.invoices:tq
EXPOSE 8080 9100
CMD ["toolq", "--help"]
