"""Waits until the topics whose names start with a prefix hold at least a
number of messages (the sum of their partitions' high watermarks), then
prints the seconds it waited. Used by scripts/bench-kafka-sink.sh to see
when the last event of a run is in Kafka, the same way for every tool.

    wait_count.py BROKERS PREFIX COUNT TIMEOUT_SECONDS
"""

import sys
import time

from confluent_kafka import Consumer, TopicPartition


def main():
    brokers, prefix, count, timeout = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    consumer = Consumer({"bootstrap.servers": brokers, "group.id": "walbridge-bench-wait"})
    start = time.monotonic()
    total = 0
    while time.monotonic() - start < timeout:
        total = 0
        for name, topic in consumer.list_topics(timeout=10).topics.items():
            if not name.startswith(prefix):
                continue
            for partition in topic.partitions:
                _, high = consumer.get_watermark_offsets(TopicPartition(name, partition), timeout=10)
                total += high
        if total >= count:
            print(f"{time.monotonic() - start:.3f}")
            return
        time.sleep(0.1)
    print(f"only {total} of {count} messages under {prefix}* after {timeout} s", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
    main()
