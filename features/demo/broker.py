"""A Kafka broker for `features demo --kafka`: the one answering at the given address, or else a single-node KRaft
broker (no ZooKeeper) that the demo runs itself on this machine, for as long as the demo runs.

The package has no Kafka client library: whether a broker serves is asked with one Kafka Metadata request over
a socket, and the local broker is Apache Kafka's own jars (`org.apache.kafka:kafka_2.13`), fetched once from
Maven Central by Spark's resolver as the session's jars are (features.engine.jars), and run with `java`. Its log
dir, settings and log are in a temporary folder, removed when it stops."""

from __future__ import annotations

import os
import shutil
import socket
import struct
import subprocess
import tempfile
import time
import uuid
from base64 import urlsafe_b64encode
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from features.engine import jars
from features.errors import ConfigError, EnvironmentProblem
from features.locks import held

KAFKA_VERSION = "4.1.1"
# The broker, and the log4j binding of the SLF4J API it logs through (Kafka's pom leaves the backend to its
# distribution; this is the one Kafka 4.1.1's distribution has).
PACKAGES = (
    jars.Package("org.apache.kafka", "kafka_2.13", KAFKA_VERSION),
    jars.Package("org.apache.logging.log4j", "log4j-slf4j-impl", "2.24.3"),
)
LOCAL_HOSTS = ("127.0.0.1", "localhost")
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0
# A small heap and the serial collector: the broker runs beside Spark's JVM, and holds little data.
JVM_OPTIONS = ["-Xms64m", "-Xmx512m", "-XX:+UseSerialGC", "-Djava.awt.headless=true"]
# The demo's events are from its own fixed dates, which a broker's defaults would reject (more than an hour
# ahead, Kafka 4.x) or delete (older than 7 days); one partition keeps the demo's stream in event time order.
SETTINGS = """process.roles=broker,controller
node.id=1
controller.quorum.voters=1@{host}:{controller_port}
listeners=PLAINTEXT://{host}:{port},CONTROLLER://{host}:{controller_port}
advertised.listeners=PLAINTEXT://{host}:{port}
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
controller.listener.names=CONTROLLER
log.dirs={data}
num.partitions=1
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
log.message.timestamp.before.max.ms=9223372036854775807
log.message.timestamp.after.max.ms=9223372036854775807
log.retention.ms=-1
num.network.threads=2
num.io.threads=2
"""
LOGGING = """status = error
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.out.ref = out
"""


def broker_answers(bootstrap_servers: str, timeout_s: float = 3.0) -> bool:
    """Does a Kafka broker serve at the first of `bootstrap_servers`: answer a Metadata request listing at least
    one live broker? (A KRaft broker opens its port before it can host a topic, and then lists none.)"""
    host, _, port = bootstrap_servers.split(",")[0].strip().rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s) as sock:
            sock.settimeout(timeout_s)
            client = b"features-demo"
            # api key 3 (Metadata), version 4 (spoken by Kafka 1.0 to 4.x), correlation id 7; no topics, and no
            # topic created by asking
            request = struct.pack(">hhih", 3, 4, 7, len(client)) + client + struct.pack(">i?", 0, False)
            sock.sendall(struct.pack(">i", len(request)) + request)
            (size,) = struct.unpack(">i", _read(sock, 4))
            if not 12 <= size < 1 << 20:
                return False  # not Kafka talking
            correlation, _throttle, brokers = struct.unpack_from(">iii", _read(sock, size))
            return correlation == 7 and brokers > 0
    except (OSError, ValueError, struct.error):
        return False


def _read(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the connection closed")
        data += chunk
    return data


def class_path() -> list[Path]:
    """The broker's jars, fetched first if they are missing, and Scala's library, which Spark's resolver leaves
    out (Spark's own copy serves: Kafka 4.1 is built for Scala 2.13, as Spark 4 is)."""
    import pyspark

    into = jars.folder() / f"kafka-broker-{KAFKA_VERSION}"
    broker = into / "jars" / PACKAGES[0].file_name
    if not broker.is_file():
        with held(jars.folder() / ".fetching.lock"):
            if not broker.is_file():
                jars.fetch(PACKAGES, into, exclude=())
    scala = sorted((Path(pyspark.__file__).parent / "jars").glob("scala-library-2.13*.jar"))
    if not scala:
        raise EnvironmentProblem("PySpark's jars have no Scala 2.13 library, which the Kafka broker needs")
    return [*sorted((into / "jars").glob("*.jar")), scala[-1]]


def _java() -> str:
    from features.engine.session import check_java

    check_java()  # Java 17+, which Spark needs too and Kafka 4.x does
    home = os.environ.get("JAVA_HOME")
    return os.path.join(home, "bin", "java") if home else (shutil.which("java") or "java")


@contextmanager
def local_broker(bootstrap_servers: str) -> Iterator[str]:
    """A single-node KRaft broker at `bootstrap_servers` (one address on this machine) while the block runs;
    yields its address. Stopped, and its folder removed, at the end."""
    address = bootstrap_servers.split(",")[0].strip()
    host, _, port = address.rpartition(":")
    if host not in LOCAL_HOSTS or "," in bootstrap_servers:
        raise ConfigError(
            f"--bootstrap-servers: no Kafka broker answers at {bootstrap_servers}, and the demo starts one of its "
            f"own only on this machine. Fix: start that broker, or pass --bootstrap-servers 127.0.0.1:<port> to "
            "use or start a local one"
        )
    if _port_taken(host, int(port)):
        raise ConfigError(
            f"--bootstrap-servers: something that is not a serving Kafka broker listens on {address}. Fix: stop it, "
            "or pass --bootstrap-servers 127.0.0.1:<a free port>"
        )
    java, path = _java(), os.pathsep.join(str(p) for p in class_path())
    with tempfile.TemporaryDirectory(prefix="features-demo-kafka-") as scratch:
        folder = Path(scratch)
        settings = folder / "server.properties"
        settings.write_text(
            SETTINGS.format(host=host, port=port, controller_port=_free_port(host), data=folder / "data")
        )
        (folder / "log4j2.properties").write_text(LOGGING)
        command = [java, *JVM_OPTIONS, f"-Dlog4j2.configurationFile={folder / 'log4j2.properties'}", "-cp", path]
        # A cluster id is 16 random bytes, URL-safe base64 without padding; one starting with '-' would be taken
        # for an option
        cluster_id = "-"
        while cluster_id.startswith("-"):
            cluster_id = urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        log = folder / "broker.log"
        with open(log, "w") as out:
            done = subprocess.run(
                [*command, "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(settings)],
                stdout=out,
                stderr=subprocess.STDOUT,
                check=False,
            )
            if done.returncode != 0:
                raise EnvironmentProblem(f"Kafka's storage tool could not format the broker's log dir:\n{_tail(log)}")
            broker = subprocess.Popen([*command, "kafka.Kafka", str(settings)], stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while not broker_answers(address, timeout_s=1.0):
                if broker.poll() is not None:
                    raise EnvironmentProblem(f"the local Kafka broker exited at start:\n{_tail(log)}")
                if time.monotonic() > deadline:
                    waited = f"{START_TIMEOUT_S:.0f} s"
                    raise EnvironmentProblem(
                        f"the local Kafka broker did not serve on {address} in {waited}:\n{_tail(log)}"
                    )
                time.sleep(0.5)
            yield address
        finally:
            broker.terminate()  # a clean shutdown leaves the quorum and closes its logs, in a few seconds
            try:
                broker.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                broker.kill()
                broker.wait()


def _port_taken(host: str, port: int) -> bool:
    try:
        socket.create_connection((host, port), timeout=1.0).close()
    except OSError:
        return False
    return True


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _tail(log: Path, lines: int = 15) -> str:
    # Java's stack frames would push the broker's own messages off the screen
    text = [line for line in log.read_text(errors="replace").splitlines() if not line.startswith(("\tat ", "\t..."))]
    return "\n".join(text[-lines:])
