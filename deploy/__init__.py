"""Running Voice: the local KRaft broker fetched from Maven Central, the process supervisor behind
``voice up``, the ``voice`` CLI, and the container files (Dockerfile, docker-compose)."""
