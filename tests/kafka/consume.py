"""Reads topics from the beginning with confluent-kafka (librdkafka's
official Python client) and prints what it read as one JSON document:

    {"messages": [{"topic", "partition", "offset", "key", "value", "headers"}]}

Keys and values are decoded as the sink's format says (`json`: parsed
JSON; a null key or value stays null). Reading stops once `--expect`
messages arrived and no more came for `--settle` seconds, or at
`--timeout` (what arrived by then is printed; the caller judges).
"""

import argparse
import json
import sys
import time

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition


def decode(data, fmt):
    if data is None:
        return None
    if fmt == "json":
        return json.loads(data)
    return data.hex()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--brokers", required=True)
    parser.add_argument("--topic", action="append", required=True)
    parser.add_argument("--format", default="json")
    parser.add_argument("--expect", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=60)
    parser.add_argument("--settle", type=float, default=1.0)
    parser.add_argument("--isolation", default="read_uncommitted")
    args = parser.parse_args()

    consumer = Consumer(
        {
            "bootstrap.servers": args.brokers,
            "group.id": "walbridge-tests",
            "enable.auto.commit": False,
            "isolation.level": args.isolation,
        }
    )
    deadline = time.monotonic() + args.timeout
    partitions = []
    for topic in args.topic:
        while True:
            metadata = consumer.list_topics(topic, timeout=10).topics.get(topic)
            if metadata is not None and metadata.error is None and metadata.partitions:
                break
            if time.monotonic() > deadline:
                print(f"topic {topic} does not exist", file=sys.stderr)
                sys.exit(3)
            time.sleep(0.2)
        partitions += [TopicPartition(topic, p, OFFSET_BEGINNING) for p in metadata.partitions]
    consumer.assign(partitions)

    messages = []
    last = time.monotonic()
    while time.monotonic() < deadline:
        message = consumer.poll(0.2)
        now = time.monotonic()
        if message is None:
            if len(messages) >= args.expect and now - last >= args.settle:
                break
            continue
        if message.error():
            if message.error().code() == message.error()._PARTITION_EOF:
                continue
            print(f"consumer error: {message.error()}", file=sys.stderr)
            sys.exit(4)
        last = now
        messages.append(
            {
                "topic": message.topic(),
                "partition": message.partition(),
                "offset": message.offset(),
                "key": decode(message.key(), args.format),
                "value": decode(message.value(), args.format),
                "headers": {k: v.decode() for k, v in (message.headers() or [])},
            }
        )
    consumer.close()
    json.dump({"messages": messages}, sys.stdout)


if __name__ == "__main__":
    main()
