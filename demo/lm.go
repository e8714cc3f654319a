package demo

import (
	"bufio"
	"bytes"
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/fleetlearn/fleetlearn/client"
	"github.com/fleetlearn/fleetlearn/data"
	"github.com/fleetlearn/fleetlearn/internal/atomicfile"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/model/train"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// LMConfig sizes the language-model demo: federated code completion on
// the Go standard library's source.
type LMConfig struct {
	Edges  int // devices, each one private package of the standard library
	Rounds int // rounds of each fine-tuning task
	Cohort int // reports per round
	// LoRARank is the rank of the LoRA task's adapters.
	LoRARank int
	// PretrainSteps are the pool job's steps; 0 is 240.
	PretrainSteps int
	// GoRoot is the Go installation whose src the corpus comes from; ""
	// is the GOROOT this program was built with where it still exists,
	// and otherwise the copy of its source built into the data package.
	GoRoot string
	Seed   uint64
	// DataDir, OutDir, Out, Log, Terminal, RankCommand and Tracer are as
	// in Config.
	DataDir     string
	OutDir      string
	Out         io.Writer
	Log         *slog.Logger
	Terminal    bool
	RankCommand []string
	Tracer      trace.TracerProvider
	UI          string // as in Config
}

// LMDefaults are the language-model demo's standard scale: a 116k-parameter
// transformer (d 64, 2 blocks, context 32), small enough that pretraining
// and both fine-tuning tasks take a few minutes on two cores.
var LMDefaults = LMConfig{Edges: 8, Rounds: 4, Cohort: 4, LoRARank: 4, Seed: 1, OutDir: DefaultOutDir}

// The model and its training.
const (
	lmContext    = 32
	lmDim        = 64
	lmLayers     = 2
	lmPerDevice  = 128 // windows a device trains on, at most
	lmPretrain   = 240 // pool steps, by default
	lmPoolBatch  = 16
	lmPoolLR     = 0.003
	lmPublicMax  = 4000 // public windows the pool trains on, at most
	lmFullHyper  = `{"epochs": 1, "batch_size": 16, "learning_rate": 0.001}`
	lmLoRAHyper  = `{"epochs": 1, "batch_size": 16, "learning_rate": 0.01}`
	lmLoRATarget = "attn.q,attn.v,mlp.fc"
)

// LMResult is what the language-model demo measured on the private
// packages' held-out tails.
type LMResult struct {
	Base       LMPoint
	Full, LoRA []LMPoint // after each committed round
	// FullBytes and LoRABytes are the bytes of update reports the server
	// took off NATS per report, for each task.
	FullBytes, LoRABytes   float64
	FullParams, LoRAParams int
	Elapsed                time.Duration
}

// LMPoint is a model's held-out next-token metrics.
type LMPoint struct {
	Loss, Accuracy float64
	Reports        uint32
}

// RunLM executes the language-model demo. Its errors start with "demo: ".
func RunLM(ctx context.Context, cfg LMConfig) (*LMResult, error) {
	res, err := runLM(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("demo: %w", err)
	}
	return res, nil
}

// lmCorpus splits the Go standard library's packages: the public ones pool
// into the pretraining set, the first edges private ones with enough
// windows become devices, and their held-out tails are the evaluation set.
// An empty goroot reads the copy of the source built into the data
// package.
func lmCorpus(goroot string, edges int) (public *data.Dataset, devices []*data.Dataset, heldOut *data.Dataset, err error) {
	opts := data.GoSourceOptions{MaxPackageBytes: 48 << 10}
	src := "the built-in copy of " + data.EmbeddedGoVersion + "'s source"
	var pkgs []data.GoPackage
	if goroot == "" {
		pkgs, err = data.EmbeddedGoSource(opts)
	} else {
		src = filepath.Join(goroot, "src")
		if _, err := os.Stat(filepath.Join(src, "fmt")); err != nil {
			return nil, nil, nil, fmt.Errorf("the language-model demo reads the Go standard library's source, and %s has none: pass --goroot with a Go installation, or leave it out for the built-in copy (%v)", src, err)
		}
		pkgs, err = data.GoSource(src, opts)
	}
	if err != nil {
		return nil, nil, nil, err
	}
	var pub, held []*data.Dataset
	for _, p := range pkgs {
		s, err := data.SplitGoPackage(p, data.WindowOptions{Window: lmContext, Stride: lmContext})
		if err != nil {
			return nil, nil, nil, err
		}
		switch {
		case s.Public:
			pub = append(pub, s.Train, s.HeldOut)
		case len(devices) < edges && s.Train.Len() >= lmPerDevice/2 && s.HeldOut.Len() > 0:
			n := min(s.Train.Len(), lmPerDevice)
			idx := make([]int, n)
			for i := range idx {
				idx[i] = i
			}
			devices = append(devices, s.Train.Subset(idx))
			held = append(held, s.HeldOut)
		}
	}
	if len(devices) < edges {
		return nil, nil, nil, fmt.Errorf("%s has only %d private packages with %d windows; ask for fewer --edges", src, len(devices), lmPerDevice/2)
	}
	if public, err = data.ConcatDatasets(pub...); err != nil {
		return nil, nil, nil, err
	}
	if public.Len() > lmPublicMax {
		idx := make([]int, lmPublicMax)
		for i := range idx {
			idx[i] = i * public.Len() / lmPublicMax
		}
		public = public.Subset(idx)
	}
	if heldOut, err = data.ConcatDatasets(held...); err != nil {
		return nil, nil, nil, err
	}
	return public, devices, heldOut, nil
}

func runLM(ctx context.Context, cfg LMConfig) (*LMResult, error) {
	start := time.Now()
	if cfg.Out == nil {
		cfg.Out = io.Discard
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Edges < 1 || cfg.Rounds < 1 || cfg.Cohort < 1 || cfg.Cohort > cfg.Edges || cfg.LoRARank < 1 {
		return nil, fmt.Errorf("need edges ≥ 1, rounds ≥ 1, 1 ≤ cohort ≤ edges and a LoRA rank ≥ 1 (got %d, %d, %d, %d)",
			cfg.Edges, cfg.Rounds, cfg.Cohort, cfg.LoRARank)
	}
	if cfg.GoRoot == "" {
		// The Go installation this program was built with, where it is
		// still there; the built-in copy of its source otherwise.
		if _, err := os.Stat(filepath.Join(runtime.GOROOT(), "src", "fmt")); err == nil {
			cfg.GoRoot = runtime.GOROOT()
		}
	}
	if cfg.PretrainSteps == 0 {
		cfg.PretrainSteps = lmPretrain
	}
	if cfg.PretrainSteps < 8 || cfg.PretrainSteps > 1<<20 {
		return nil, fmt.Errorf("pretraining steps %d, want 8 to %d", cfg.PretrainSteps, 1<<20)
	}
	if err := tryUIAddr(cfg.UI); err != nil {
		return nil, err
	}
	if cfg.OutDir == "" {
		cfg.OutDir = DefaultOutDir
	}
	dataDir, removeData, err := workDirs(cfg.OutDir, cfg.DataDir)
	if err != nil {
		return nil, err
	}
	defer removeData()
	pr := &progress{w: cfg.Out, terminal: cfg.Terminal}
	defer pr.end()
	pr.printf("Fleetlearn language-model demo: federated code completion on the Go standard library, %d devices (one package each), %d rounds of %d reports; results go to %s",
		cfg.Edges, cfg.Rounds, cfg.Cohort, cfg.OutDir)

	corpus := "the built-in copy of " + data.EmbeddedGoVersion + "'s standard library source"
	if cfg.GoRoot != "" {
		corpus = filepath.Join(cfg.GoRoot, "src")
	}
	ph := pr.start("reading the corpus", 1, "reading "+corpus)
	public, devices, heldOut, err := lmCorpus(cfg.GoRoot, cfg.Edges)
	if err != nil {
		return nil, err
	}
	ph.step(fmt.Sprintf("%d public windows, %d devices, %d held-out windows", public.Len(), len(devices), heldOut.Len()))
	pr.end()
	poolData := filepath.Join(dataDir, "pool-data")
	if err := data.WriteDir(filepath.Join(poolData, "public"), public, "go-public"); err != nil {
		return nil, err
	}
	evalDir := filepath.Join(dataDir, "heldout")
	if err := data.WriteDir(evalDir, heldOut, "go-heldout"); err != nil {
		return nil, err
	}

	sys, err := startSystem(ctx, dataDir, "127.0.0.1:0", cfg.Log, cfg.Tracer, cfg.UI)
	if err != nil {
		return nil, err
	}
	defer sys.close()
	if err := sys.announceUI(pr); err != nil {
		return nil, err
	}
	srv, conn := sys.srv, sys.conn
	mod, sha, err := sys.registerExample(ctx, "lm")
	if err != nil {
		return nil, err
	}
	pr.printf("update module: lm (transformer, AdamW, ABI %d), sha256 %s (embedded)", mod.GetRef().GetAbiVersion(), sha)

	init, err := train.InitLM(train.LMConfig{Vocab: data.VocabSize, Context: lmContext, Dim: lmDim, Layers: lmLayers}, cfg.Seed)
	if err != nil {
		return nil, err
	}
	models := apiv1.NewModelServiceClient(conn)
	initVersion, err := importModel(ctx, models, "gocode-init", init)
	if err != nil {
		return nil, err
	}

	stopFleet, err := sys.startFleet(ctx, pr, dataDir, devices, cfg.Log, nil)
	if err != nil {
		return nil, err
	}
	defer stopFleet()

	// Pretraining on the pool, from the registered initial model.
	rankCommand := cfg.RankCommand
	if len(rankCommand) == 0 {
		if rankCommand, err = defaultRankCommand(); err != nil {
			return nil, err
		}
	}
	poolCtx, stopPool := context.WithCancel(ctx)
	waitPool, err := startPool(poolCtx, srv, dataDir, poolData, rankCommand, cfg.Log)
	if err != nil {
		stopPool()
		return nil, err
	}
	defer func() { stopPool(); waitPool() }()
	spec := &pb.PoolJobSpec{
		Id: "pretrain-gocode", Tenant: "default", Ranks: poolWorkers,
		PerRank:     &pb.PoolResources{MilliCpu: poolRankCPU, MemoryBytes: poolRankMemory},
		MaxRestarts: 3, CheckpointInterval: int64(cfg.PretrainSteps / 8 * 2), TotalSteps: int64(cfg.PretrainSteps), OutputModel: "gocode",
		Program: &pb.PoolJobSpec_Builtin{Builtin: &pb.PoolBuiltinTrainer{InitModel: initVersion, Seed: cfg.Seed,
			BatchSize: lmPoolBatch, LearningRate: lmPoolLR, SyncEvery: int64(cfg.PretrainSteps / 8),
			Dataset: &pb.PoolDataset{Source: "dir:public", First: 0, Count: int64(public.Len())}}},
	}
	_, base, err := pretrainOnPool(ctx, conn, spec, fmt.Sprintf("%d public windows of Go source, AdamW", public.Len()), pr, nil)
	if err != nil {
		return nil, err
	}
	stopPool()
	waitPool()
	baseMet, err := train.EvaluateLM(base, heldOut, nil)
	if err != nil {
		return nil, err
	}
	res := &LMResult{Base: LMPoint{Loss: baseMet.Loss, Accuracy: baseMet.Accuracy}}
	pr.printf("base model: held-out loss %.4f (perplexity %.2f), next-token accuracy %.2f%%", baseMet.Loss, baseMet.Perplexity(), 100*baseMet.Accuracy)

	baseVersion, err := importModel(ctx, models, "gocode-base", base)
	if err != nil {
		return nil, err
	}
	lora, err := train.AddLoRA(base, cfg.LoRARank, strings.Split(lmLoRATarget, ","), cfg.Seed)
	if err != nil {
		return nil, err
	}
	loraVersion, err := importModel(ctx, models, "gocode-lora", lora)
	if err != nil {
		return nil, err
	}
	res.FullParams = base.Layout().Size()
	for _, i := range train.LoRAParams(lora) {
		res.LoRAParams += len(lora.Tensors[i].Data)
	}
	task := func(name, version, hyper string, trainable []string) *pb.Task {
		return &pb.Task{Name: name, Model: &pb.ModelRef{Version: version}, Module: mod.GetRef(),
			Hyperparameters: []byte(hyper), CohortTarget: uint32(cfg.Cohort), ReportGoal: uint32(max(1, cfg.Cohort*3/4)),
			RoundsTotal: uint32(cfg.Rounds), SelectionTimeout: durationpb.New(20 * time.Second), ReportTimeout: durationpb.New(2 * time.Minute),
			Eligibility: &pb.Eligibility{MinExamples: 1, RequireCharging: true}, ServerEvalDataset: evalDir, Trainable: trainable}
	}
	metrics := "http://" + srv.MetricsAddr() + "/metrics"
	if res.Full, res.FullBytes, err = runLMTask(ctx, conn, pr, metrics, task("gocode-full", baseVersion, lmFullHyper, nil),
		fmt.Sprintf("full fine-tuning: all %d parameters train and travel", res.FullParams)); err != nil {
		return nil, err
	}
	if res.LoRA, res.LoRABytes, err = runLMTask(ctx, conn, pr, metrics, task("gocode-lora", loraVersion, lmLoRAHyper, []string{"lora"}),
		fmt.Sprintf("LoRA fine-tuning: rank %d adapters on %s, %d parameters train and travel", cfg.LoRARank, lmLoRATarget, res.LoRAParams)); err != nil {
		return nil, err
	}
	res.Elapsed = time.Since(start)
	if err := writeLMResults(cfg.OutDir, res); err != nil {
		return nil, err
	}
	full, lo := res.Full[len(res.Full)-1], res.LoRA[len(res.LoRA)-1]
	pr.printf("held-out loss: base %.4f, full fine-tuning %.4f (%+.4f), LoRA %.4f (%+.4f)",
		res.Base.Loss, full.Loss, full.Loss-res.Base.Loss, lo.Loss, lo.Loss-res.Base.Loss)
	pr.printf("next-token accuracy: base %.2f%%, full %.2f%%, LoRA %.2f%%", 100*res.Base.Accuracy, 100*full.Accuracy, 100*lo.Accuracy)
	pr.printf("bytes per update report on NATS: full %.0f, LoRA %.0f (%.1fx fewer)", res.FullBytes, res.LoRABytes, res.FullBytes/res.LoRABytes)
	pr.printf("wrote %s and %s; done in %v", filepath.Join(cfg.OutDir, "lm.csv"), filepath.Join(cfg.OutDir, "lm.png"),
		res.Elapsed.Round(100*time.Millisecond))
	sys.keepServingUI(ctx, pr)
	return res, nil
}

func importModel(ctx context.Context, models apiv1.ModelServiceClient, name string, m *model.Model) (string, error) {
	var buf bytes.Buffer
	if err := model.WriteSafetensors(&buf, m); err != nil {
		return "", err
	}
	got, err := client.ImportModel(ctx, models, &pb.ImportModelHeader{Name: name, SizeBytes: uint64(buf.Len())}, &buf)
	if err != nil {
		return "", fmt.Errorf("import %s: %w", name, err)
	}
	return got.GetRef().GetVersion(), nil
}

// runLMTask creates a fine-tuning task, follows its rounds and returns the
// held-out metrics after each and the report bytes per report.
func runLMTask(ctx context.Context, conn *grpc.ClientConn, pr *progress, metrics string, t *pb.Task, what string) ([]LMPoint, float64, error) {
	tasks := apiv1.NewTaskServiceClient(conn)
	before, err := scrapeReportBytes(ctx, metrics)
	if err != nil {
		return nil, 0, err
	}
	created, err := tasks.CreateTask(ctx, &pb.CreateTaskRequest{Task: t})
	if err != nil {
		return nil, 0, fmt.Errorf("create task %s: %w", t.GetName(), err)
	}
	watch, err := tasks.WatchTask(ctx, &pb.WatchTaskRequest{TaskId: created.GetTask().GetId()})
	if err != nil {
		return nil, 0, err
	}
	pr.start(t.GetName(), int(t.GetRoundsTotal()), what)
	var pts []LMPoint
	var reports uint32
	roundStart := time.Now()
	for len(pts) < int(t.GetRoundsTotal()) {
		msg, err := watch.Recv()
		if err != nil {
			return nil, 0, fmt.Errorf("watch %s: %w", t.GetName(), err)
		}
		ev := msg.GetEvent()
		switch ev.GetType() {
		case pb.RoundEventType_ROUND_EVENT_TYPE_COMMITTED:
			m := ev.GetMetrics().GetValues()
			p := LMPoint{Loss: m["server_loss"], Accuracy: m["server_accuracy"], Reports: ev.Reported}
			pts = append(pts, p)
			reports += ev.Reported
			pr.round(RoundResult{Round: ev.Round, Reports: ev.Reported, Dropped: ev.Dropped, Accuracy: p.Accuracy, Loss: p.Loss,
				Elapsed: time.Since(roundStart)})
			roundStart = time.Now()
		case pb.RoundEventType_ROUND_EVENT_TYPE_ABANDONED:
			pr.printf("  round %d abandoned: %s; retrying", ev.Round, ev.Reason)
		}
	}
	pr.end()
	after, err := scrapeReportBytes(ctx, metrics)
	if err != nil {
		return nil, 0, err
	}
	return pts, (after - before) / float64(max(reports, 1)), nil
}

// scrapeReportBytes reads the server's count of report bytes taken off NATS.
func scrapeReportBytes(ctx context.Context, url string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, fmt.Errorf("server metrics: %w", err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "fleetlearn_report_bytes_total "); ok {
			return strconv.ParseFloat(v, 64)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("server metrics: %w", err)
	}
	return 0, errors.New("server metrics: no fleetlearn_report_bytes_total")
}

func writeLMResults(dir string, res *LMResult) error {
	f, err := atomicfile.Create(filepath.Join(dir, "lm.csv"), 0o644)
	if err != nil {
		return err
	}
	defer f.Abort()
	w := csv.NewWriter(f)
	w.Write([]string{"task", "round", "heldout_loss", "heldout_accuracy", "reports", "bytes_per_report"})
	ff := func(v float64) string { return strconv.FormatFloat(v, 'f', 6, 64) }
	w.Write([]string{"base", "0", ff(res.Base.Loss), ff(res.Base.Accuracy), "", ""})
	for _, task := range []struct {
		name  string
		pts   []LMPoint
		bytes float64
	}{{"full", res.Full, res.FullBytes}, {"lora", res.LoRA, res.LoRABytes}} {
		for i, p := range task.pts {
			w.Write([]string{task.name, strconv.Itoa(i + 1), ff(p.Loss), ff(p.Accuracy), strconv.Itoa(int(p.Reports)), ff(task.bytes)})
		}
	}
	w.Flush()
	if err := w.Error(); err != nil {
		return err
	}
	if err := f.Commit(); err != nil {
		return err
	}
	return plotLM(filepath.Join(dir, "lm.png"), res)
}

// plotLM draws held-out loss per round for both fine-tuning tasks, from
// the pretrained base at round 0.
func plotLM(path string, res *LMResult) error {
	p := plot.New()
	p.Title.Text = "Federated fine-tuning of a transformer on Go source"
	p.X.Label.Text = "round"
	p.Y.Label.Text = "held-out loss (nats per token)"
	line := func(pts []LMPoint) (*plotter.Line, *plotter.Scatter, error) {
		xy := plotter.XYs{{X: 0, Y: res.Base.Loss}}
		for i, q := range pts {
			xy = append(xy, plotter.XY{X: float64(i + 1), Y: q.Loss})
		}
		return plotter.NewLinePoints(xy)
	}
	fl, fp, err := line(res.Full)
	if err != nil {
		return err
	}
	ll, lp, err := line(res.LoRA)
	if err != nil {
		return err
	}
	ll.Dashes = []vg.Length{vg.Points(6), vg.Points(3)}
	lp.Shape = nil
	n := float64(max(len(res.Full), len(res.LoRA)))
	base, err := plotter.NewLine(plotter.XYs{{X: 0, Y: res.Base.Loss}, {X: n, Y: res.Base.Loss}})
	if err != nil {
		return err
	}
	base.Dashes = []vg.Length{vg.Points(2), vg.Points(2)}
	p.Add(plotter.NewGrid(), fl, fp, ll, lp, base)
	p.Legend.Add(fmt.Sprintf("full fine-tuning (%.0f B/report)", res.FullBytes), fl, fp)
	p.Legend.Add(fmt.Sprintf("LoRA (%.0f B/report)", res.LoRABytes), ll)
	p.Legend.Add("pretrained base", base)
	p.Legend.Left = true // the curves fall from the top left
	p.Y.Tick.Marker = plot.TickerFunc(func(lo, hi float64) []plot.Tick {
		ts := plot.DefaultTicks{}.Ticks(lo, hi)
		for i := range ts {
			if ts[i].Label != "" {
				ts[i].Label = strconv.FormatFloat(ts[i].Value, 'f', 3, 64)
			}
		}
		return ts
	})
	return savePNG(p, path)
}
