"""A third-party client of walbridge's change feed, for the tests.

It is what a service consuming the feed would write: stubs generated from
proto/walbridge/feed/v1/feed.proto by grpcio-tools (at start, into a
temporary directory), the relation descriptions kept by number to decode
changes without any registry, acknowledgements sent after processing.

    feed_client.py --address HOST:PORT [--ca FILE] [--token-env NAME]
                   [--client-cert FILE --client-key FILE] COMMAND ...

Commands:

    subscribe --open JSON [--units N] [--idle SECONDS] [--ack each|none]
              [--ack-every N] [--output FILE] [--timeout SECONDS]
              [--reconnect SECONDS]
        Opens a Subscribe stream with `open` (the Open message in protobuf's
        JSON mapping) and writes one JSON line per response: {"event": kind,
        "message": ..., "decoded": ...}; changes and rows are decoded into
        {"table", "operation", "new", "old"} with tagged values ({"int64": 5},
        {"timestamp": "2024-02-29T11:00:00.500000+00:00"}, ...). Stops after
        N units (a commit, a batch of rows, a copy's end, a message outside a
        transaction) or SECONDS without a unit; the last line is {"end":
        "stopped"} or {"end": "error", "code": "OUT_OF_RANGE", "details": ...}.
        With --reconnect, a stream that fails as UNAVAILABLE is opened again
        (a line {"reconnect": ...} says so) for up to SECONDS of failures.
    call METHOD [JSON]
        A unary RPC of ChangeFeed (CreateConsumer, ...): the response, or
        {"error": code, "details": ...}.
    health [SERVICE]
        The standard health check: {"status": "SERVING"}.
    reflect
        Through server reflection only: the services listed, and the
        ChangeFeed service's methods as its descriptor says.
"""

import argparse
import base64
import importlib
import json
import math
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from datetime import timezone

import grpc
import grpc_tools
from google.protobuf import json_format

HERE = os.path.dirname(os.path.abspath(__file__))
PROTO_ROOT = os.path.join(HERE, "..", "..", "proto")


def load_stubs(work):
    """feed_pb2 and feed_pb2_grpc, compiled from the proto."""
    include = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
    subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO_ROOT}", f"-I{include}",
         f"--python_out={work}", f"--grpc_python_out={work}", "walbridge/feed/v1/feed.proto"],
        check=True,
    )
    sys.path.insert(0, work)
    return (importlib.import_module("walbridge.feed.v1.feed_pb2"),
            importlib.import_module("walbridge.feed.v1.feed_pb2_grpc"))


class Token(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
            grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds `authorization: Bearer <token>` to every call on a channel."""

    def __init__(self, token):
        self.header = ("authorization", f"Bearer {token}")

    def add(self, details):
        metadata = list(details.metadata or ()) + [self.header]
        return details._replace(metadata=metadata)

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self.add(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self.add(details), request)

    def intercept_stream_unary(self, continuation, details, requests):
        return continuation(self.add(details), requests)

    def intercept_stream_stream(self, continuation, details, requests):
        return continuation(self.add(details), requests)


def channel(args):
    """A channel to the feed: TLS with --ca (and a client certificate with
    --client-cert/--client-key), the token of --token-env on every call."""
    if args.ca:
        with open(args.ca, "rb") as f:
            root = f.read()
        key = cert = None
        if args.client_cert:
            with open(args.client_key, "rb") as f:
                key = f.read()
            with open(args.client_cert, "rb") as f:
                cert = f.read()
        credentials = grpc.ssl_channel_credentials(root, key, cert)
        opened = grpc.secure_channel(args.address, credentials)
    else:
        opened = grpc.insecure_channel(args.address)
    if args.token_env:
        return grpc.intercept_channel(opened, Token(os.environ[args.token_env]))
    return opened


def as_dict(message):
    """A message in protobuf's JSON mapping, default values included."""
    return json_format.MessageToDict(message, preserving_proto_field_name=True,
                                     always_print_fields_with_no_presence=True)


def decode_value(value):
    """A Value as {kind: decoded}, with its text form when sent."""
    kind = value.WhichOneof("kind")
    if kind is None:
        decoded = {"unknown": None}
    elif kind == "null":
        decoded = None
    elif kind == "unchanged_toast":
        decoded = {"unchanged_toast": True}
    elif kind == "double":
        d = value.double
        decoded = {"double": d if math.isfinite(d) else repr(d)}
    elif kind == "bytes":
        decoded = {"bytes": value.bytes.hex()}
    elif kind == "timestamp":
        decoded = {"timestamp": value.timestamp.ToDatetime(tzinfo=timezone.utc).isoformat()}
    elif kind == "json":
        decoded = {"json": json.loads(value.json)}
    elif kind == "array":
        decoded = {"array": [decode_value(e) for e in value.array.elements]}
    else:
        decoded = {kind: getattr(value, kind)}
    if value.HasField("text"):
        return {"value": decoded, "text": value.text}
    return decoded


class Decoder:
    """Relations by number, as the stream describes them."""

    def __init__(self):
        self.relations = {}

    def describe(self, relation):
        self.relations[relation.relation] = relation

    def table(self, number):
        r = self.relations[number]
        return f"{r.schema}.{r.table}"

    def row(self, number, row):
        if row is None:
            return None
        columns = self.relations[number].columns
        assert len(columns) == len(row.values), "a row's values match its relation's columns"
        return {c.name: decode_value(v) for c, v in zip(columns, row.values)}

    def change(self, change, operation_name):
        decoded = {
            "id": [change.id.source, change.id.lsn, change.id.sequence],
            "operation": operation_name(change.operation),
        }
        if change.HasField("message"):
            decoded["message"] = {
                "prefix": change.message.prefix,
                "content": change.message.content.decode("utf-8", "replace"),
            }
            return decoded
        if change.relations:
            decoded["tables"] = [self.table(n) for n in change.relations]
            decoded["cascade"] = change.cascade
            decoded["restart_identity"] = change.restart_identity
            return decoded
        decoded["table"] = self.table(change.relation)
        decoded["new"] = self.row(change.relation, change.new if change.HasField("new") else None)
        decoded["old"] = self.row(change.relation, change.old if change.HasField("old") else None)
        return decoded

    def rows(self, rows):
        return {
            "table": self.table(rows.relation),
            "first_id": [rows.first_id.source, rows.first_id.lsn, rows.first_id.sequence],
            "rows": [self.row(rows.relation, r) for r in rows.rows],
        }


def subscribe(args, pb, stubs, out):
    """Sessions until one stops; with --reconnect, a session the server
    ends as UNAVAILABLE (walbridge stopped or killed) is followed by
    another, as the same durable consumer, once the feed answers again."""
    state = {"units": 0, "since_ack": 0, "idle_from": time.monotonic()}

    def write(line):
        out.write(json.dumps(line) + "\n")
        out.flush()

    down_since = None
    while True:
        outcome = session(args, pb, stubs, state, write)
        if outcome is None:
            return
        code, details = outcome
        retry = args.reconnect and code == grpc.StatusCode.UNAVAILABLE
        if retry:
            down_since = down_since or time.monotonic()
            retry = time.monotonic() - down_since < args.reconnect
        if not retry:
            write({"end": "error", "code": code.name, "details": details})
            return
        if state.get("connected"):
            write({"reconnect": code.name, "details": details})
            down_since = time.monotonic()
        state["connected"] = False
        time.sleep(0.2)


def session(args, pb, stubs, state, write):
    """One Subscribe stream: None when it stopped, else the error's code
    and details."""
    stub = stubs.ChangeFeedStub(channel(args))
    requests = queue.Queue()
    open_message = json_format.ParseDict(json.loads(args.open), pb.Open())
    requests.put(pb.SubscribeRequest(open=open_message))

    def request_iterator():
        while True:
            item = requests.get()
            if item is None:
                return
            yield item

    responses = stub.Subscribe(request_iterator(), timeout=args.timeout)
    decoder = Decoder()
    operation_name = pb.Operation.Name
    # Held while a response is processed (written, then acknowledged), so
    # closing never falls between the two.
    lock = threading.Lock()
    closing = []

    def close(reason):
        """Ends our side of the stream: the server stores the last
        acknowledgement, then ends its side."""
        if not closing:
            closing.append(reason)
            requests.put(None)

    def watch_idle():
        while not closing:
            time.sleep(0.05)
            with lock:
                if time.monotonic() - state["idle_from"] > args.idle:
                    close("idle")

    if args.idle:
        threading.Thread(target=watch_idle, daemon=True).start()
    try:
        for response in responses:
            with lock:
                if closing:
                    continue
                kind = response.WhichOneof("event")
                message = getattr(response, kind)
                line = {"event": kind,
                        "message": as_dict(message)}
                token = None
                unit = False
                if kind == "subscribed":
                    state["connected"] = True
                    # Idle time counts within a session, not across a reconnection.
                    state["idle_from"] = time.monotonic()
                elif kind == "relation":
                    decoder.describe(message)
                elif kind == "change":
                    line["decoded"] = decoder.change(message, operation_name)
                elif kind == "rows":
                    line["decoded"] = decoder.rows(message)
                    token = message.resume_token
                    unit = bool(token)
                elif kind in ("commit", "copy_complete"):
                    token, unit = message.resume_token, True
                elif kind == "sequences":
                    token, unit = message.resume_token, True
                elif kind == "message":
                    token, unit = message.resume_token, True
                    line["decoded"] = {"prefix": message.prefix,
                                       "content": message.content.decode("utf-8", "replace")}
                elif kind == "progress":
                    token = message.resume_token
                write(line)
                if unit:
                    state["units"] += 1
                    state["since_ack"] += 1
                    state["idle_from"] = time.monotonic()
                if token and args.ack == "each" and (not unit or state["since_ack"] >= args.ack_every):
                    requests.put(pb.SubscribeRequest(ack=pb.Ack(resume_token=token)))
                    write({"acked": base64.b64encode(token).decode()})
                    state["since_ack"] = 0
                if args.units and state["units"] >= args.units:
                    close("units")
    except grpc.RpcError as e:
        return e.code(), e.details()
    finally:
        close("ended")
    write({"end": "stopped", "reason": closing[0], "units": state["units"]})
    return None


def call(args, pb, stubs, out):
    stub = stubs.ChangeFeedStub(channel(args))
    method = getattr(stub, args.method)
    request_type = getattr(pb, f"{args.method}Request")
    request = json_format.ParseDict(json.loads(args.request or "{}"), request_type())
    try:
        response = method(request, timeout=30)
    except grpc.RpcError as e:
        out.write(json.dumps({"error": e.code().name, "details": e.details()}) + "\n")
        return
    out.write(json.dumps(as_dict(response)) + "\n")


def health(args, out):
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    stub = health_pb2_grpc.HealthStub(channel(args))
    try:
        response = stub.Check(health_pb2.HealthCheckRequest(service=args.service), timeout=10)
    except grpc.RpcError as e:
        out.write(json.dumps({"error": e.code().name, "details": e.details()}) + "\n")
        return
    out.write(json.dumps({"status": health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)}) + "\n")


def reflect(args, out):
    from google.protobuf.descriptor_pool import DescriptorPool
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase
    database = ProtoReflectionDescriptorDatabase(channel(args))
    try:
        services = list(database.get_services())
    except grpc.RpcError as e:
        out.write(json.dumps({"error": e.code().name, "details": e.details()}) + "\n")
        return
    pool = DescriptorPool(database)
    service = pool.FindServiceByName("walbridge.feed.v1.ChangeFeed")
    methods = {m.name: {"input": m.input_type.full_name, "output": m.output_type.full_name,
                        "client_streaming": m.client_streaming if hasattr(m, "client_streaming") else None}
               for m in service.methods}
    out.write(json.dumps({"services": services, "methods": methods}) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--address", required=True)
    parser.add_argument("--ca")
    parser.add_argument("--client-cert")
    parser.add_argument("--client-key")
    parser.add_argument("--token-env")
    commands = parser.add_subparsers(dest="command", required=True)
    s = commands.add_parser("subscribe")
    s.add_argument("--open", required=True)
    s.add_argument("--units", type=int, default=0)
    s.add_argument("--idle", type=float, default=0)
    s.add_argument("--ack", choices=["each", "none"], default="each")
    s.add_argument("--ack-every", type=int, default=1)
    s.add_argument("--output")
    s.add_argument("--timeout", type=float, default=300)
    s.add_argument("--reconnect", type=float, default=0)
    c = commands.add_parser("call")
    c.add_argument("method")
    c.add_argument("request", nargs="?")
    h = commands.add_parser("health")
    h.add_argument("service", nargs="?", default="")
    commands.add_parser("reflect")
    args = parser.parse_args()

    out = open(args.output, "a", buffering=1) if getattr(args, "output", None) else sys.stdout
    if args.command == "health":
        return health(args, out)
    if args.command == "reflect":
        return reflect(args, out)
    with tempfile.TemporaryDirectory() as work:
        pb, stubs = load_stubs(work)
        if args.command == "subscribe":
            subscribe(args, pb, stubs, out)
        else:
            call(args, pb, stubs, out)


if __name__ == "__main__":
    main()
