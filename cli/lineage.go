package cli

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// maxLineageDepth bounds the walk up a model's parents: a registry's
// parent links come from the server, and a cycle must not hang the CLI.
const maxLineageDepth = 100_000

func newModelLineageCommand(a *app) *cobra.Command {
	var format string
	cmd := &cobra.Command{
		Use:   "lineage MODEL",
		Short: "Show where a model came from and what was trained from it",
		Long: "lineage shows MODEL's chain: the pool job that pretrained its root (spec and data\n" +
			"digests, checkpoint, usage), each version between, and the federated rounds that\n" +
			"fine-tuned it, grouped by task, each model drawn under the one it was made from (a LoRA\n" +
			"model under its base, a task under the model it started from). MODEL is NAME, NAME@N or a\n" +
			"sha256 (prefix).",
		Example: "  fleetlearn model lineage gocode          # the pool job, the model, what was trained from it\n" +
			"  fleetlearn model lineage ft-lora@5       # from a task's round back to the pool job\n" +
			"  fleetlearn model lineage gocode -o json",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFormat(format); err != nil {
				return err
			}
			return a.call(cmd, false, func(ctx context.Context, conn *grpc.ClientConn) error {
				c := apiv1.NewModelServiceClient(conn)
				version, err := resolveModel(ctx, c, args[0])
				if err != nil {
					return err
				}
				all, err := listAll(ctx, func(ctx context.Context, token string) ([]*pb.Model, string, error) {
					res, err := c.ListModels(ctx, &pb.ListModelsRequest{PageToken: token, PageSize: modelPageSize})
					return res.GetModels(), res.GetNextPageToken(), err
				})
				if err != nil {
					return err
				}
				l, err := lineageOf(version, all)
				if err != nil {
					return err
				}
				if root := l.chain[0]; root.GetLineage().GetJobId() != "" {
					res, err := apiv1.NewPoolServiceClient(conn).GetJob(ctx, &pb.GetJobRequest{JobId: root.GetLineage().GetJobId()})
					switch status.Code(err) {
					case codes.OK:
						l.job = res.GetJob()
					case codes.NotFound, codes.PermissionDenied:
						// The lineage recorded with the model still says
						// what the job was.
					default:
						return err
					}
				}
				if format == formatJSON {
					return writeJSON(cmd.OutOrStdout(), l.proto())
				}
				return l.print(cmd.OutOrStdout(), modelLabels(all))
			})
		},
	}
	addFormatFlag(cmd, &format)
	return cmd
}

type lineage struct {
	chain       []*pb.Model // root first, the asked version last
	descendants []*pb.Model // trained from the asked version, in creation order
	job         *pb.PoolJob
}

// lineageOf finds version in all and walks its parents up and its
// children down.
func lineageOf(version string, all []*pb.Model) (*lineage, error) {
	byVersion := map[string]*pb.Model{}
	children := map[string][]*pb.Model{}
	for _, m := range all {
		byVersion[m.GetRef().GetVersion()] = m
	}
	for _, m := range all {
		if p := m.GetRef().GetParentVersion(); p != "" {
			children[p] = append(children[p], m)
		}
	}
	m, ok := byVersion[version]
	if !ok {
		return nil, unknownModel(fmt.Sprintf("model %s is not in the registry", version))
	}
	l := &lineage{}
	seen := map[string]bool{}
	for m != nil && !seen[m.GetRef().GetVersion()] && len(l.chain) < maxLineageDepth {
		seen[m.GetRef().GetVersion()] = true
		l.chain = append(l.chain, m)
		m = byVersion[m.GetRef().GetParentVersion()]
	}
	slices.Reverse(l.chain)
	queue := []string{version}
	for len(queue) > 0 && len(l.descendants) < maxLineageDepth {
		v := queue[0]
		queue = queue[1:]
		for _, c := range children[v] {
			if cv := c.GetRef().GetVersion(); !seen[cv] {
				seen[cv] = true
				l.descendants = append(l.descendants, c)
				queue = append(queue, cv)
			}
		}
	}
	slices.SortStableFunc(l.descendants, func(a, b *pb.Model) int {
		return a.GetCreateTime().AsTime().Compare(b.GetCreateTime().AsTime())
	})
	return l, nil
}

func (l *lineage) proto() *pb.ListModelsResponse {
	return &pb.ListModelsResponse{Models: slices.Concat(l.chain, l.descendants)}
}

func (l *lineage) print(w io.Writer, labels map[string]string) error {
	label := func(m *pb.Model) string {
		if s := labels[m.GetRef().GetVersion()]; s != "" {
			return s + " " + shortSHA(m.GetRef().GetVersion())
		}
		return m.GetRef().GetVersion()
	}
	indent := ""
	if lin := l.chain[0].GetLineage(); lin.GetJobId() != "" {
		u := lin.GetUsage()
		fmt.Fprintf(w, "pool job %s: %d steps, spec %s, data %s, checkpoint %s\n", printable(lin.GetJobId()), lin.GetSteps(),
			shortSHA(lin.GetSpecDigest()), shortSHA(lin.GetDataSha256()), shortSHA(lin.GetCheckpoint()))
		fmt.Fprintf(w, "  used %.1f CPU-s, %.1f GPU-s, peak %s, %s\n", u.GetCpuSeconds(), u.GetGpuSeconds(),
			byteSize(uint64(max(u.GetPeakMemoryBytes(), 0))), energy(u.GetEnergyJoules()))
		if j := l.job; j != nil {
			fmt.Fprintf(w, "  tenant %s, submitted by %s, %d restarts, %s\n", printable(j.GetSpec().GetTenant()),
				printable(orDash(j.GetSubmitter())), j.GetRestarts(), jobState(j.GetState()))
		}
		indent = "└─ "
	}
	pad := ""
	for i, m := range l.chain {
		what := modelSource(m.GetSource())
		if m.GetTaskId() != "" {
			what = fmt.Sprintf("task %s round %d", m.GetTaskId(), m.GetRound())
		}
		mark := ""
		if i == len(l.chain)-1 {
			mark = "   ← this version"
		}
		fmt.Fprintf(w, "%s%smodel %s (%s)%s\n", pad, indent, printable(label(m)), printable(what), mark)
		if indent != "" {
			pad += "   "
		}
		indent = "└─ "
	}
	if len(l.descendants) == 0 {
		fmt.Fprintf(w, "%s   (nothing trained from it yet)\n", pad)
		return nil
	}
	l.printDescendants(w, pad, label)
	return nil
}

// maxLineageIndent bounds how deep the tree of descendants is drawn; deeper
// models are listed flat at that depth.
const maxLineageIndent = 32

// printDescendants draws what was made from the asked version as a tree,
// each model under its parent. The rounds of one task form a chain (round
// k's model is round k+1's parent) and are shown as one line, with what
// was derived from any of them below it.
func (l *lineage) printDescendants(w io.Writer, pad string, label func(*pb.Model) string) {
	children := map[string][]*pb.Model{}
	for _, m := range l.descendants { // in creation order
		p := m.GetRef().GetParentVersion()
		children[p] = append(children[p], m)
	}
	var walk func(parents []*pb.Model, task, pad string)
	walk = func(parents []*pb.Model, task, pad string) {
		if len(pad) > 3*maxLineageIndent {
			pad = pad[:3*maxLineageIndent]
		}
		for _, parent := range parents {
			for _, m := range children[parent.GetRef().GetVersion()] {
				t := m.GetTaskId()
				if t != "" && t == task {
					continue // the run's own next round, drawn with the run
				}
				if t == "" {
					fmt.Fprintf(w, "%s└─ model %s (%s, derived)\n", pad, printable(label(m)), strings.ToLower(modelSource(m.GetSource())))
					walk([]*pb.Model{m}, "", pad+"   ")
					continue
				}
				run := taskRun(m, children)
				first, last := run[0].GetRound(), run[0].GetRound()
				for _, r := range run {
					first, last = min(first, r.GetRound()), max(last, r.GetRound())
				}
				fmt.Fprintf(w, "%s└─ federated task %s: %d rounds (%d–%d), newest model %s\n", pad, printable(t), len(run),
					first, last, printable(label(run[len(run)-1])))
				walk(run, t, pad+"   ")
			}
		}
	}
	walk(l.chain[len(l.chain)-1:], "", pad)
}

// taskRun returns the models of first's task that descend from first
// through models of that task, first included, in creation order.
func taskRun(first *pb.Model, children map[string][]*pb.Model) []*pb.Model {
	run := []*pb.Model{first}
	for i := 0; i < len(run) && len(run) < maxLineageDepth; i++ {
		for _, c := range children[run[i].GetRef().GetVersion()] {
			if c.GetTaskId() == first.GetTaskId() {
				run = append(run, c)
			}
		}
	}
	slices.SortStableFunc(run, func(a, b *pb.Model) int {
		return a.GetCreateTime().AsTime().Compare(b.GetCreateTime().AsTime())
	})
	return run
}
