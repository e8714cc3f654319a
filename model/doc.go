// Package model holds Fleetlearn's parameter sets: an ordered list of named
// float32 tensors plus the lineage saying where they came from, and the
// encodings that move them between cloud pretraining, the aggregator and edge
// devices.
//
// # Order and layout
//
// A Model's tensor order is canonical: Layout, Flatten, Hash and
// WriteSafetensors all follow it. Parties that agree on a Layout can
// therefore exchange plain []float32 vectors (updates, aggregates) and turn
// them back into models with Layout.Unflatten.
//
// # Safetensors
//
// ReadSafetensors, DecodeSafetensors and WriteSafetensors speak the
// safetensors format (https://huggingface.co/docs/safetensors): an 8-byte
// little-endian header length N, N bytes of JSON header, then the byte
// buffer. The header maps each tensor name to
// {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the
// buffer) and may hold a "__metadata__" object of string values.
//
// A JSON object is unordered, so safetensors itself gives tensors no order.
// The reader orders them by data_offsets, which is the model order the writer
// lays out; files from other tools (PyTorch's writer, for one, groups tensors
// by dtype) load in their buffer order.
//
// The reader accepts F32 and converts F16, BF16 (both exactly) and F64
// (rounded to nearest) to float32, so PyTorch and Hugging Face checkpoints
// import; integer, bool and other dtypes are refused with ErrUnsupportedDType.
// Files come from the network, so the reader trusts nothing: the header length
// and the buffer size are capped (WithMaxHeaderBytes, WithMaxTensorBytes), the
// header must be valid UTF-8 JSON starting with '{' with no duplicate keys,
// shapes must not overflow and must match each tensor's byte length, the
// offsets must cover the buffer exactly (in bounds, no overlaps, no holes, no
// trailing bytes), and NaN or ±Inf values are refused with ErrNonFinite. A
// header that claims more than the input holds costs little memory: buffers
// grow with the bytes actually read. Every refusal wraps one of the package's
// sentinel errors (ErrInvalidHeader, ErrTooLarge, ...).
//
// The writer is deterministic: "__metadata__" comes first, then the tensors in
// model order with their keys in that same order, data as F32 little-endian,
// and the header padded with spaces to a multiple of 8 bytes as the Hugging
// Face implementation does.
//
// Lineage travels in "__metadata__" under the keys fleetlearn.version,
// fleetlearn.parent, fleetlearn.task, fleetlearn.round (decimal),
// fleetlearn.job and fleetlearn.source, and a model's architecture
// (Model.Arch) under fleetlearn.arch. The writer omits empty fields and a
// zero round; the reader ignores other metadata keys (PyTorch's
// "format": "pt", for instance).
//
// # Hash
//
// Hash is SHA-256 over canonical bytes that depend only on tensor names,
// shapes, values and the architecture, never on lineage or on how a file's
// header was formatted:
//
//	"fleetlearn-model-v1\n"
//	uvarint(number of tensors)
//	for each tensor, in model order:
//	    uvarint(len(name)) name
//	    uvarint(rank) uvarint(dim 0) ... uvarint(dim rank-1)
//	    each value's float32 bits, 4 bytes little-endian
//	if the model has an architecture (Arch):
//	    uvarint(len(arch)) arch
//
// uvarint is encoding/binary's unsigned varint. The encoding is
// self-delimiting: a tensor's byte length follows from its shape. Values are
// compared bit for bit, so 0 and -0 hash differently.
package model
