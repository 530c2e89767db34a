"""Writes the Arrow IPC files the walk's unit tests read (pyarrow >= 16):

    python3 make.py    # in this folder

Row i of a file seeded `seed` holds sample(seed, i) and label(i) (the
tests compute the same)."""

import os

import pyarrow as pa


def sample(seed, i):
    n = 10 + (i * 37) % 300
    return bytes((i * 7 + k + seed) % 251 for k in range(n))


def label(i):
    return i * 3 - 5


ROWS = 25


def image_struct(seed):
    return pa.array(
        [{"bytes": sample(seed, i), "path": f"img/{i}.jpg"} for i in range(ROWS)],
        type=pa.struct([("bytes", pa.binary()), ("path", pa.string())]),
    )


def stream(name, table, chunk=10, **opts):
    with pa.OSFile(name, "wb") as f:
        w = pa.ipc.new_stream(f, table.schema, options=pa.ipc.IpcWriteOptions(**opts))
        w.write_table(table, max_chunksize=chunk)
        w.close()


def file(name, table, chunk=10):
    with pa.OSFile(name, "wb") as f:
        w = pa.ipc.new_file(f, table.schema)
        w.write_table(table, max_chunksize=chunk)
        w.close()


labels = pa.array([label(i) for i in range(ROWS)], type=pa.int64())
text = pa.array([f"caption {i}" * (i % 4) for i in range(ROWS)], type=pa.string())

# Hugging Face's layout: an Image feature (struct of bytes and path), a
# ClassLabel (int64), a text column first; the schema's metadata as
# `datasets` writes it.
# Two files as `save_to_disk` names them (seeds 1 and 7).
os.makedirs("hf", exist_ok=True)
for k, seed in enumerate((1, 7)):
    hf = pa.table({"text": text, "image": image_struct(seed), "label": labels}).replace_schema_metadata(
        {"huggingface": '{"info": {"features": {"image": {"_type": "Image"}, "label": {"_type": "ClassLabel"}}}}'}
    )
    stream(f"hf/data-0000{k}-of-00002.arrow", hf)

# The file format; columns that take other buffer counts before the
# sample: a dictionary, a list, a large binary, a fixed-size binary, a
# null column, a string view (variadic buffers); an int32 label.
n = ROWS
many = pa.table(
    {
        "dict": pa.array([["a", "b", "c"][i % 3] for i in range(n)]).dictionary_encode(),
        "list": pa.array([[i, i + 1][: i % 3] for i in range(n)], type=pa.list_(pa.int32())),
        "big": pa.array([b"x" * (i % 5) for i in range(n)], type=pa.large_binary()),
        "fixed": pa.array([bytes([i] * 4) for i in range(n)], type=pa.binary(4)),
        "none": pa.nulls(n),
        "view": pa.array([f"v{i}" * 10 for i in range(n)], type=pa.string_view()),
        "sample": pa.array([sample(2, i) for i in range(n)], type=pa.binary()),
        "label": pa.array([label(i) for i in range(n)], type=pa.int32()),
    }
)
file("many_columns.arrow", many, chunk=7)

# A large_binary sample and an unsigned 8-bit label; a fixed-size one.
stream(
    "large.arrow",
    pa.table(
        {
            "sample": pa.array([sample(3, i) for i in range(n)], type=pa.large_binary()),
            "label": pa.array([i * 10 % 256 for i in range(n)], type=pa.uint8()),
        }
    ),
)
stream(
    "fixed.arrow",
    pa.table(
        {
            "sample": pa.array([(sample(4, i) * 2)[:16] for i in range(n)], type=pa.binary(16)),
            "label": pa.array([label(i) for i in range(n)], type=pa.int16()),
        }
    ),
)

# Refused: a compressed body; a null sample; an image stored by path.
stream("compressed.arrow", pa.table({"sample": pa.array([sample(5, i) for i in range(n)]), "label": labels}),
       compression="lz4")
stream(
    "nulls.arrow",
    pa.table({"sample": pa.array([None if i == 13 else sample(6, i) for i in range(n)]), "label": labels}),
)
stream(
    "by_path.arrow",
    pa.table(
        {
            "image": pa.array([{"bytes": None, "path": f"{i}.jpg"} for i in range(n)],
                              type=pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
            "label": labels,
        }
    ),
)
