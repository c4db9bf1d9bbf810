"""Spec §16 test vectors and RocketMQ's parsing rules for the small building blocks."""

from __future__ import annotations

import os
import random
import zlib

import pytest

from rmqdump.codec.crc import (
    body_crc,
    decode_crc_property_value,
    encode_crc_property_value,
    reference_body_crc,
    reference_crc32,
)
from rmqdump.codec.encoder import encode_blank, encode_fields, with_record_crc
from rmqdump.codec.javahash import index_key_hash, java_string_hash, parse_delay_levels, tags_hash
from rmqdump.codec.msgid import create_offset_msg_id, decode_offset_msg_id, decode_uniq_key, format_host, parse_host
from rmqdump.codec.properties import parse_properties, split_keys
from rmqdump.codec.record import Message, decode_record, record_crc_property
from rmqdump.errors import FormatError


@pytest.mark.parametrize("key,hashcode,keyhash,slot", [
    ("TopicTest#KEY1", -1656969516, 1656969516, 1969516),
    ("TopicTest#KEY2", -1656969515, 1656969515, 1969515),
    ("TopicTest#0A00000530391B6D358654A6C3D20007", -440388173, 440388173, 388173),
    ("TopicTest#订单123", -609830755, 609830755, 4830755),
    ("polygenelubricants", -2147483648, 0, 0),
])
def test_java_hash_and_index_slot(key, hashcode, keyhash, slot):
    assert java_string_hash(key) == hashcode
    assert index_key_hash(key) == keyhash
    assert keyhash % 5_000_000 == slot


def test_tags_code_vectors():
    assert tags_hash("TagA") == 2598919
    assert tags_hash("tag-ÄÖÜ") == -1550069289
    assert tags_hash("😀") == 1772899  # two UTF-16 units
    assert tags_hash(None) == tags_hash("") == 0
    assert parse_delay_levels()[17] == 7_200_000 and len(parse_delay_levels()) == 18


@pytest.mark.parametrize("data,masked", [(b"Hello RocketMQ", 1774740973), (b"123456789", 1274296614), (b"", 0)])
def test_crc_vectors(data, masked):
    assert body_crc(data) == masked == reference_body_crc(data)


def test_zlib_hot_path_equals_crcmod_reference():
    rnd = random.Random(7)
    for n in (1, 7, 64, 1000, 4096, 65537):
        data = bytes(rnd.getrandbits(8) for _ in range(n))
        assert zlib.crc32(data) == reference_crc32(data)
        assert body_crc(memoryview(data)) == reference_body_crc(data)


def test_crc_property_digits_are_reversed():
    assert encode_crc_property_value(701423673) == "3763241070"
    assert encode_crc_property_value(123) == "3210000000"
    assert decode_crc_property_value("3763241070") == 701423673
    with pytest.raises(ValueError):
        decode_crc_property_value("12x")


def test_offset_msg_id_vectors():
    lo = bytes([127, 0, 0, 1])
    assert create_offset_msg_id(lo, 10911, 0) == "7F00000100002A9F0000000000000000"
    assert create_offset_msg_id(lo, 10911, 1073742001) == "7F00000100002A9F00000000400000B1"
    v6 = bytes(15) + b"\x01"
    assert create_offset_msg_id(v6, 10911, 1073741824) == \
        "0000000000000000000000000000000100002A9F0000000040000000"
    d = decode_offset_msg_id("7F00000100002A9F0000000040000000")
    assert (d.host, d.offset) == ("127.0.0.1:10911", 1073741824)
    assert decode_offset_msg_id("0000000000000000000000000000000100002A9F0000000040000000").host == "[::1]:10911"
    for bad in ("xyz", "7F00000100002A9F000000004000000G", "7F00000100002A9F00000000400000"):
        with pytest.raises(FormatError):
            decode_offset_msg_id(bad)


def test_uniq_key_vector():
    # the spec's producer ran at UTC+8 (month start 2024-05-01T00:00+08:00); born 2 s later
    u = decode_uniq_key("0A00000530391B6D358654A6C3D20007", reference_ms=1715913015250 + 2000)
    assert (u.ip, u.pid, u.classloader, u.time_in_month_ms, u.counter) == ("10.0.0.5", 12345, 0x1B6D3586,
                                                                             1420215250, 7)
    assert (u.timestamp, u.utc_offset_minutes) == (1715913015250, 480)
    assert decode_uniq_key("0A00000530391B6D358654A6C3D20007").timestamp is None
    with pytest.raises(FormatError):
        decode_uniq_key("0A000005")


def test_uniq_key_late_in_the_month():
    """After 24.8 days of a month the client's ``(int) (now - monthStart)`` passes 2^31: RocketMQ reads that
    time back unsigned (getNearlyTimeFromID), so a key made on the 26th decodes to the 26th, and rmqdump
    writes the bits the Java client writes (the low 32 bits of the difference, not 31 of them)."""
    from rmqdump.write.message import make_uniq_key

    born = 1795696496123  # 2026-11-26T12:34:56.123Z: 25.5 days after the UTC month start
    start = 1793491200000  # 2026-11-01T00:00Z
    java_int = born - start - (1 << 32)  # what (int) (now - startTime) is in Java: negative
    assert java_int < 0
    key = make_uniq_key(bytes([10, 0, 0, 5]), 12345, 0x1B6D3586, born, 7)
    assert key[20:28] == (java_int & 0xFFFFFFFF).to_bytes(4, "big").hex().upper()
    u = decode_uniq_key(key, reference_ms=born + 1500)
    assert (u.time_in_month_ms, u.timestamp, u.utc_offset_minutes) == (born - start, born, 0)
    # a UTC+8 producer (month start 2026-10-31T16:00Z), 30 days into its month
    key8 = "0A00000530391B6D3586" + f"{(30 * 86_400_000 + 5) & 0xFFFFFFFF:08X}" + "0001"
    u8 = decode_uniq_key(key8, reference_ms=1793462400000 + 30 * 86_400_000 + 900)
    assert (u8.timestamp, u8.utc_offset_minutes) == (1793462400000 + 30 * 86_400_000 + 5, 480)


def test_hosts_round_trip():
    for text in ("127.0.0.1:10911", "[fd00::2]:40001", "[2001:db8::1:2]:1"):
        assert format_host(*parse_host(text)) == text
    assert format_host(*parse_host("2001:db8:0:0:0:0:1:2|10911")) == "[2001:db8::1:2]:10911"


def test_properties_parse_rules():
    # short segments ignored, empty key or value ignored, later duplicates win, no trailing separator
    raw = "KEYS\x01a  b   c\x02\x02x\x02\x01v\x02k\x01\x02WAIT\x01true\x02WAIT\x01false\x02用户\x01值"
    p = parse_properties(raw)
    assert p == {"KEYS": "a  b   c", "WAIT": "false", "用户": "值"}
    assert split_keys(p["KEYS"]) == ["a", "b", "c"]
    assert split_keys(None) == [] and split_keys("") == []
    assert parse_properties("") == {}


SPEC_RECORD = ("000000bfdaa320a769c865ed00000001000000000000000000000005000000004000000000000000"
               "0000018bcfe56800c0a8000a0000d4310000018bcfe5687b7f00000100002a9f000000000000000000000000"
               "0000000e48656c6c6f20526f636b65744d5109546f70696354657374004d54414753015461674102"
               "4b455953014b455931204b45593202554e49515f4b455901304130303030303533303339314236443335"
               "38363534413643334432303030370257414954017472756502")


def test_complete_record_vector_decodes_and_encodes():
    raw = bytes.fromhex(SPEC_RECORD)
    m = decode_record(raw, 0, len(raw), 0, 1073741824, "00000000001073741824")
    assert isinstance(m, Message)
    assert (m.size, m.queue_id, m.queue_offset, m.physical_offset, m.born_host, m.store_host) == (
        191, 1, 5, 1073741824, "192.168.0.10:54321", "127.0.0.1:10911")
    assert (m.topic, m.tags, m.keys, m.uniq_key, m.body) == (
        "TopicTest", "TagA", ["KEY1", "KEY2"], "0A00000530391B6D358654A6C3D20007", b"Hello RocketMQ")
    assert m.tags_code() == 2598919 and m.msg_id == "7F00000100002A9F0000000040000000"
    again = encode_fields(topic=m.topic_raw, body=m.body, properties=m.properties_raw, queue_id=1, queue_offset=5,
                          physical_offset=1073741824, born_timestamp=m.born_timestamp, born_addr=m.born_addr,
                          born_port=m.born_port, store_timestamp=m.store_timestamp, store_addr=m.store_addr,
                          store_port=m.store_port)
    assert again == raw
    with_crc = with_record_crc(raw)
    assert len(with_crc) == 211 and with_crc.endswith(b"__CRC32#\x013763241070\x02")
    m2 = decode_record(with_crc, 0, len(with_crc), 0, 1073741824, "x")
    assert record_crc_property(m2, with_crc) == (701423673, 701423673)


def test_blank_vector():
    assert encode_blank(824).hex() == "00000338cbd43194"
    with pytest.raises(FormatError):
        encode_blank(7)


def test_decoder_never_raises_on_random_bytes():
    rnd = random.Random(11)
    raw = bytes.fromhex(SPEC_RECORD)
    for _ in range(3000):
        data = bytearray(raw)
        for _ in range(rnd.randint(1, 6)):
            data[rnd.randrange(len(data))] = rnd.getrandbits(8)
        cut = rnd.randint(0, len(data))
        decode_record(bytes(data[:cut]), 0, cut, 0, 0, "f")  # must return, never raise
    for _ in range(500):
        blob = os.urandom(rnd.randint(0, 300))
        decode_record(blob, 0, len(blob), 0, 0, "f")


def test_real_uniq_keys_decode_to_their_born_time():
    from conftest import manifest

    n = 0
    for m in manifest("clean"):
        if m["type"] == "message" and m["uniqKey"] and m["reconsumeTimes"] == 0 and m["topic"] != "TopicDelay":
            u = decode_uniq_key(m["uniqKey"], m["bornTimestamp"])
            assert u.ip == "fd00::2" and u.utc_offset_minutes == 0
            assert 0 <= m["bornTimestamp"] - u.timestamp < 1000, m
            n += 1
    assert n > 150
