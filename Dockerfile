# The unthrottle image: the CLI today, the operator and node agent in later issues.
FROM python:3.11-slim
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
RUN pip install --no-cache-dir . && rm -rf /src
USER 65534
ENTRYPOINT ["unthrottle"]
