package mlpasm

import (
	"fmt"

	"github.com/fleetlearn/fleetlearn/wasm/internal/wasmbin"
)

// fn assembles one function body. Locals are named; control flow is
// structured by Go closures, so every block the generator opens is closed
// and branch depths are counted by the assembler, not by hand.
type fn struct {
	nparams int
	locals  []wasmbin.ValType // declared locals, after the parameters
	index   map[string]uint32
	code    []byte
	depth   int // open blocks, loops and ifs
	imports map[string]uint32
}

func newFn(imports map[string]uint32, params ...string) *fn {
	f := &fn{index: map[string]uint32{}, imports: imports, nparams: len(params)}
	for i, p := range params {
		f.index[p] = uint32(i)
	}
	return f
}

func (f *fn) local(name string, t wasmbin.ValType) string {
	if _, ok := f.index[name]; ok {
		panic("mlpasm: local " + name + " declared twice")
	}
	f.index[name] = uint32(f.nparams + len(f.locals))
	f.locals = append(f.locals, t)
	return name
}

func (f *fn) idx(name string) uint32 {
	i, ok := f.index[name]
	if !ok {
		panic("mlpasm: no local " + name)
	}
	return i
}

func (f *fn) op(b ...byte) *fn { f.code = append(f.code, b...); return f }

func (f *fn) get(name string) *fn { return f.op(0x20).u32(f.idx(name)) }
func (f *fn) set(name string) *fn { return f.op(0x21).u32(f.idx(name)) }
func (f *fn) tee(name string) *fn { return f.op(0x22).u32(f.idx(name)) }

func (f *fn) u32(v uint32) *fn { f.code = wasmbin.AppendU32(f.code, v); return f }

func (f *fn) i32(v int32) *fn { f.code = append(f.code, wasmbin.I32Const(v)...); return f }
func (f *fn) f32(v float32) *fn {
	f.code = append(f.code, wasmbin.F32Const(v)...)
	return f
}
func (f *fn) f64(v float64) *fn { f.code = append(f.code, wasmbin.F64Const(v)...); return f }

func (f *fn) call(name string) *fn {
	i, ok := f.imports[name]
	if !ok {
		panic("mlpasm: no import " + name)
	}
	f.code = append(f.code, wasmbin.Call(i)...)
	return f
}

// Memory access at a constant offset from the address on the stack.
func (f *fn) loadI32(off uint32) *fn  { return f.op(0x28, 2).u32(off) }
func (f *fn) loadF32(off uint32) *fn  { return f.op(0x2a, 2).u32(off) }
func (f *fn) load8U(off uint32) *fn   { return f.op(0x2d, 0).u32(off) }
func (f *fn) storeI32(off uint32) *fn { return f.op(0x36, 2).u32(off) }
func (f *fn) store8(off uint32) *fn   { return f.op(0x3a, 0).u32(off) }
func (f *fn) memorySize() *fn         { return f.op(0x3f, 0) }
func (f *fn) memoryGrow() *fn         { return f.op(0x40, 0) }
func (f *fn) ret() *fn                { return f.op(0x0f) }
func (f *fn) drop() *fn               { return f.op(0x1a) }
func (f *fn) add() *fn                { return f.op(0x6a) }
func (f *fn) sub() *fn                { return f.op(0x6b) }
func (f *fn) mul() *fn                { return f.op(0x6c) }
func (f *fn) divU() *fn               { return f.op(0x6e) }
func (f *fn) remU() *fn               { return f.op(0x70) }
func (f *fn) and() *fn                { return f.op(0x71) }
func (f *fn) or() *fn                 { return f.op(0x72) }
func (f *fn) shl() *fn                { return f.op(0x74) }
func (f *fn) shrU() *fn               { return f.op(0x76) }
func (f *fn) eq() *fn                 { return f.op(0x46) }
func (f *fn) ne() *fn                 { return f.op(0x47) }
func (f *fn) ltS() *fn                { return f.op(0x48) }
func (f *fn) gtS() *fn                { return f.op(0x4a) }
func (f *fn) gtU() *fn                { return f.op(0x4b) }
func (f *fn) leS() *fn                { return f.op(0x4c) }
func (f *fn) geS() *fn                { return f.op(0x4e) }
func (f *fn) eqz() *fn                { return f.op(0x45) }
func (f *fn) f32Neg() *fn             { return f.op(0x8c) }
func (f *fn) f32Gt() *fn              { return f.op(0x5e) }
func (f *fn) f64Add() *fn             { return f.op(0xa0) }
func (f *fn) f64Mul() *fn             { return f.op(0xa2) }
func (f *fn) f64Div() *fn             { return f.op(0xa3) }
func (f *fn) f64FromI32() *fn         { return f.op(0xb7) }
func (f *fn) selectOp() *fn           { return f.op(0x1b) }
func (f *fn) brIf(depth int) *fn      { return f.op(0x0d).u32(uint32(depth)) }
func (f *fn) br(depth int) *fn        { return f.op(0x0c).u32(uint32(depth)) }
func (f *fn) open(op byte) *fn        { f.depth++; return f.op(op, wasmbin.BlockEmpty) }
func (f *fn) end() *fn                { f.depth--; return f.op(wasmbin.OpEnd) }
func (f *fn) minS(a, b func()) *fn {
	a()
	b()
	a()
	b()
	f.ltS()
	return f.selectOp()
}
func (f *fn) then(body func()) *fn      { f.open(0x04); body(); return f.end() }
func (f *fn) ifElse(a, b func()) *fn    { f.open(0x04); a(); f.op(0x05); b(); return f.end() }
func (f *fn) block(body func(exit int)) { f.open(0x02); d := f.depth; body(d); f.end() }

// exitTo is the branch depth, from the current nesting, of the block that
// was opened at depth d.
func (f *fn) exitTo(d int) int { return f.depth - d }

// loopFor runs body for v = from; v < to; v += step, where from, to and step
// each push one i32. to and step are evaluated on every iteration.
func (f *fn) loopFor(v string, from, to, step func(), body func()) {
	from()
	f.set(v)
	f.block(func(exit int) {
		f.open(0x03) // loop
		f.get(v)
		to()
		f.geS().brIf(f.exitTo(exit))
		body()
		f.get(v)
		step()
		f.add().set(v)
		f.br(0)
		f.end()
	})
}

// loopDown runs body for v = from-1 down to 0.
func (f *fn) loopDown(v string, from func(), body func()) {
	from()
	f.set(v)
	f.block(func(exit int) {
		f.open(0x03)
		f.get(v).i32(0).leS().brIf(f.exitTo(exit))
		f.get(v).i32(1).sub().set(v)
		body()
		f.br(0)
		f.end()
	})
}

func (f *fn) finish(typ uint32) wasmbin.Func {
	if f.depth != 0 {
		panic(fmt.Sprintf("mlpasm: %d blocks left open", f.depth))
	}
	return wasmbin.Func{Type: typ, Locals: f.locals, Body: f.code}
}
