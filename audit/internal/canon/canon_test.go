package canon

import (
	"encoding/json"
	"errors"
	"math"
	"testing"
)

func TestBuild(t *testing.T) {
	b, err := Build(func(o *Object) {
		o.String("s", "a\"b\\c\n\x01<&>\u2028é")
		o.Uint("u", math.MaxUint64)
		o.Int("i", -3)
		o.Float("f", 0.1)
		o.Float("g", 1e21)
		o.Float("h", 1e-7)
		o.Float("z", math.Copysign(0, -1))
		o.Float("w", 3)
		o.Bool("b", true)
		o.Object("o", func(in *Object) { in.String("x", "") })
		o.Strings("l", []string{"b", "a"})
		o.StringMap("m", map[string]string{"b": "2", "a": "1"})
		o.FloatMap("n", map[string]float64{"z": 0.5, "y": 1})
	})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"s":"a\"b\\c\n\u0001<&>` + "\u2028é" + `","u":18446744073709551615,"i":-3,"f":0.1,"g":1e+21,"h":1e-7,"z":0,"w":3,"b":true,"o":{"x":""},"l":["b","a"],"m":{"a":"1","b":"2"},"n":{"y":1,"z":0.5}}`
	if string(b) != want {
		t.Fatalf("got  %s\nwant %s", b, want)
	}
	if c, err := Canonicalize(b); err != nil || string(c) != want {
		t.Fatalf("Canonicalize(Build()) = %s, %v", c, err)
	}
	if !json.Valid(b) {
		t.Fatal("not valid JSON")
	}
	for _, bad := range []func(*Object){
		func(o *Object) { o.Float("x", math.NaN()) },
		func(o *Object) { o.Float("x", math.Inf(1)) },
		func(o *Object) { o.String("x", "\xff") },
		func(o *Object) { o.String("\xfe", "") },
		func(o *Object) { o.Object("x", func(in *Object) { in.Float("y", math.Inf(-1)) }) },
	} {
		if _, err := Build(bad); !errors.Is(err, ErrNotValue) {
			t.Errorf("Build: %v", err)
		}
	}
}

func TestCanonicalize(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{` { "b" : [ 1 , 2.50, -0, 1E3, "\u00e9\/" ] , "a" : null } `, `{"b":[1,2.5,0,1000,"é/"],"a":null}`},
		{`"\ud83d\ude00"`, `"😀"`},
		{`1e400`, ``},
		{`100000000000000000000`, `100000000000000000000`},
		{`18446744073709551616`, `18446744073709552000`},
		{`{"a":1,"a":2}`, ``},
		{`"\ud83d"`, ``},
		{`"\ude00\ud83d"`, ``},
		{"\"\xff\"", ``},
		{"\"\x01\"", ``},
		{`01`, ``},
		{`1.`, ``},
		{`-`, ``},
		{`[1,]`, ``},
		{`{"a"}`, ``},
		{`{} {}`, ``},
		{`tru`, ``},
		{`"\x"`, ``},
	} {
		got, err := Canonicalize([]byte(tc.in))
		if tc.want == "" {
			if !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrNotValue) {
				t.Errorf("Canonicalize(%s) = %s, %v; want an error", tc.in, got, err)
			}
			continue
		}
		if err != nil || string(got) != tc.want {
			t.Errorf("Canonicalize(%s) = %s, %v; want %s", tc.in, got, err, tc.want)
		}
	}
	deep := make([]byte, 0, 200)
	for range 100 {
		deep = append(deep, '[')
	}
	if _, err := Canonicalize(deep); !errors.Is(err, ErrInvalid) {
		t.Errorf("deep nesting: %v", err)
	}
	if _, err := CanonicalizeObject([]byte(` [1]`)); !errors.Is(err, ErrInvalid) {
		t.Errorf("CanonicalizeObject(array): %v", err)
	}
}

func FuzzCanonicalize(f *testing.F) {
	f.Add([]byte(`{"a":[1,2.5,"x\n"],"b":{"c":null,"d":true}}`))
	f.Add([]byte(`1e-7`))
	f.Add([]byte(`"\ud83d\ude00"`))
	f.Fuzz(func(t *testing.T, in []byte) {
		out, err := Canonicalize(in)
		if err != nil {
			return
		}
		if !json.Valid(out) {
			t.Fatalf("invalid output %q from %q", out, in)
		}
		again, err := Canonicalize(out)
		if err != nil || string(again) != string(out) {
			t.Fatalf("not idempotent: %q -> %q -> %q, %v", in, out, again, err)
		}
	})
}
