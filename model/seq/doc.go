// Package seq is Fleetlearn's generic layer-list network: a model whose
// architecture is a list of layers ("seq:input(1,28,28),conv(32,5,pad=2),
// relu,maxpool(2),…,dense(10)") kept in the model file itself
// (model.Model.Arch, the safetensors metadata key fleetlearn.arch), and one
// training step (forward, backward, SGD with an optional FedProx term)
// written once over an abstract tensor machine, Ops. The WASM seq module
// runs it on the sandbox's ABI v4 host kernels and the native trainer
// (package train) on package kernel; both make the same kernel calls in the
// same order, so they produce the same weights bit for bit.
//
// Activations are one row per example holding C·H·W values in PyTorch's
// NCHW order, so a flatten costs nothing and the tensors keep PyTorch's
// names and layouts: the layer at position i of the list (input() not
// counted, as in an nn.Sequential) owns "<i>.weight" and "<i>.bias":
//
//	conv(out,k[,stride=s][,pad=p])  <i>.weight [out, in, k, k], <i>.bias [out]
//	dense(out)                      <i>.weight [out, in],       <i>.bias [out]
//	groupnorm(g)                    <i>.weight [C],             <i>.bias [C]
//	layernorm                       <i>.weight, <i>.bias shaped as the input ([C, H, W] or [D])
//	relu, maxpool(k[,stride=s]), avgpool(k[,stride=s]), dropout(p), flatten: no tensors
//
// A dense layer may carry a LoRA adapter "<i>.lora_a" [r, in] and
// "<i>.lora_b" [out, r]; it then computes x·(W + B·A)ᵀ + b.
//
// The package uses only the standard library so that modules built with it
// stay small.
package seq
