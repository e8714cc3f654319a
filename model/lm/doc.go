// Package lm is Fleetlearn's small decoder-only transformer language model:
// its tensor names and shapes, its hyper-parameters, and one training step
// (forward, backward, AdamW) written once over an abstract tensor machine,
// Ops. The WASM example module runs it on the sandbox's host kernels and the
// native trainer (package train) on package kernel; both make the same
// kernel calls in the same order, so given the same inputs they produce the
// same weights bit for bit.
//
// The model is GPT-style with pre-norm blocks:
//
//	tok_emb.weight [V, D], pos_emb.weight [T, D]
//	blocks.<i>.ln1.{weight,bias} [D]
//	blocks.<i>.attn.{q,k,v,proj}.weight [D, D]
//	blocks.<i>.ln2.{weight,bias} [D]
//	blocks.<i>.mlp.fc.weight [F, D], blocks.<i>.mlp.fc.bias [F]
//	blocks.<i>.mlp.proj.weight [D, F], blocks.<i>.mlp.proj.bias [D]
//	ln_f.{weight,bias} [D], lm_head.weight [V, D]
//
// Any Linear weight W ("<name>.weight", [out, in]) may carry a LoRA adapter
// "<name>.lora_a" [r, in] and "<name>.lora_b" [out, r]; the layer then
// computes x·(W + B·A)ᵀ. Training only the adapters (the task's trainable
// list) is LoRA fine-tuning; merging B·A into W removes them.
//
// A dataset example is a window of T token ids and the id that follows it;
// every position is trained to predict the next token (the window shifted by
// one, then the label), so one example gives T predictions.
//
// The package uses only the standard library so that modules built with it
// stay small.
package lm
