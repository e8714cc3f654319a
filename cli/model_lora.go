package cli

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/fleetlearn/fleetlearn/client"
	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/model/lm"
	"github.com/fleetlearn/fleetlearn/model/train"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// newModelLoRACommand adds LoRA adapters to a language model for a LoRA
// fine-tuning task, and folds them back in for export.
func newModelLoRACommand(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "lora",
		Short: "Add LoRA adapters to a language model, or merge them into its weights",
		Example: "  fleetlearn model lora add gocode --rank 4 --targets attn.q,attn.v --name gocode-lora\n" +
			"  fleetlearn model lora merge tuned-lora.safetensors -o tuned.safetensors",
	}
	var (
		rank                   int
		targets                string
		seed                   uint64
		out, name, description string
		force                  bool
	)
	add := &cobra.Command{
		Use:   "add MODEL --rank R --targets attn.q,attn.v --name NAME | add IN.safetensors ... -o OUT.safetensors",
		Short: "Add a rank-R adapter to every Linear layer named by --targets, of a registered model or a file",
		Long: "add gives every Linear layer whose name ends in one of --targets (" + strings.Join(lm.LoRATargets, ", ") + ")\n" +
			"an adapter <name>.lora_a [R, in] (Kaiming-uniform from --seed) and <name>.lora_b [out, R] (zero),\n" +
			"so the adapted model computes exactly what its base does.\n\n" +
			"With --name, MODEL is a registered model (NAME, NAME@N or a sha256 prefix): add downloads it and\n" +
			"imports the adapted model as --name with MODEL as its parent, so model lineage follows it from\n" +
			"the pool job that trained MODEL to the tasks that fine-tune it (-o also writes the file).\n" +
			"Without --name, it reads IN.safetensors and writes -o; model import --parent then keeps the link.\n" +
			"Create a task from it with --trainable lora: only the adapters train and travel. Merge them\n" +
			"afterwards with model export --merge-lora or model lora merge.",
		Example: "  fleetlearn model lora add gocode --rank 4 --targets attn.q,attn.k,attn.v,attn.proj,mlp.fc,mlp.proj --name gocode-lora\n" +
			"  fleetlearn model lora add base.safetensors --rank 8 --targets attn.q,attn.v -o lora.safetensors\n" +
			"  fleetlearn model import lora.safetensors --name gocode-lora --parent gocode",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var ts []string
			for _, t := range strings.Split(targets, ",") {
				if t = strings.TrimSpace(t); t != "" {
					ts = append(ts, t)
				}
			}
			source := fmt.Sprintf("fleetlearn model lora add --rank %d --targets %s --seed %d", rank, targets, seed)
			if name == "" {
				if out == "" {
					return fmt.Errorf("%w: give --name NAME to adapt a registered model and import the result, or -o FILE to write a file", ErrUsage)
				}
				m, err := readModelFile(args[0])
				if err != nil {
					return err
				}
				am, err := train.AddLoRA(m, rank, ts, seed)
				if err != nil {
					return fmt.Errorf("%w: %v", ErrUsage, err)
				}
				am.Lineage.Source = source
				return writeLoRAResult(cmd, out, am, force, m)
			}
			if err := checkModelName("--name", name); err != nil {
				return err
			}
			if out != "" && !force {
				if _, err := os.Lstat(out); err == nil {
					return fmt.Errorf("%w: %s exists; pass --force to replace it", ErrUsage, out)
				}
			}
			return a.call(cmd, true, func(ctx context.Context, conn *grpc.ClientConn) error {
				return loraAddRegistered(ctx, cmd, apiv1.NewModelServiceClient(conn), args[0], loraAdd{
					rank: rank, targets: ts, seed: seed, source: source, name: name, description: description, out: out, force: force})
			})
		},
	}
	add.Flags().IntVar(&rank, "rank", 8, fmt.Sprintf("adapter rank, 1 to %d", lm.MaxRank))
	add.Flags().StringVar(&targets, "targets", "attn.q,attn.v", "comma-separated Linear layers to adapt: "+strings.Join(lm.LoRATargets, ",")+"; for a seq: model, positions of dense layers (6,8)")
	add.Flags().Uint64Var(&seed, "seed", 1, "seed of the adapters' A matrices")
	add.Flags().StringVar(&name, "name", "", "MODEL is a registered model: import the adapted model under this name, with MODEL as its parent")
	add.Flags().StringVar(&description, "description", "", "with --name: description of the imported model (default: what was added to which model)")
	add.Flags().StringVarP(&out, "output", "o", "", "safetensors file to write; required without --name; it appears only once complete")
	add.Flags().BoolVar(&force, "force", false, "replace --output if it exists")
	merge := &cobra.Command{
		Use:     "merge IN.safetensors -o OUT.safetensors",
		Short:   "Write the model with every adapter folded into its weight (W + B·A) and removed",
		Example: "  fleetlearn model lora merge tuned-lora.safetensors -o tuned.safetensors",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := readModelFile(args[0])
			if err != nil {
				return err
			}
			if len(train.LoRAParams(m)) == 0 {
				return fmt.Errorf("%w: %s has no LoRA adapters, so there is nothing to merge", ErrUsage, args[0])
			}
			mm, err := train.MergeLoRA(m)
			if err != nil {
				return fmt.Errorf("%w: %v", ErrUsage, err)
			}
			mm.Lineage.Source = "fleetlearn model lora merge"
			return writeLoRAResult(cmd, out, mm, force, m)
		},
	}
	merge.Flags().StringVarP(&out, "output", "o", "", "safetensors file to write (required); it appears only once complete")
	merge.Flags().BoolVar(&force, "force", false, "replace --output if it exists")
	merge.MarkFlagRequired("output")
	cmd.AddCommand(add, merge)
	return cmd
}

// loraAdd is what model lora add does to a registered model.
type loraAdd struct {
	rank                           int
	targets                        []string
	seed                           uint64
	source, name, description, out string
	force                          bool
}

// loraAddRegistered downloads ref, adds the adapters and imports the
// result under a.name with ref's version as its parent.
func loraAddRegistered(ctx context.Context, cmd *cobra.Command, c apiv1.ModelServiceClient, ref string, a loraAdd) error {
	version, err := resolveModel(ctx, c, ref)
	if err != nil {
		return err
	}
	_, raw, err := client.ExportModelBytes(ctx, c, version, 0)
	if err != nil {
		if errors.Is(err, client.ErrProtocol) {
			return fmt.Errorf("model lora add: %w: %v", ErrProtocol, err)
		}
		return err
	}
	base, err := model.ReadSafetensors(bytes.NewReader(raw))
	if err != nil {
		return fmt.Errorf("model lora add: %s: %w", version, err)
	}
	am, err := train.AddLoRA(base, a.rank, a.targets, a.seed)
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrUsage, ref, err)
	}
	am.Lineage = model.Lineage{Parent: version, Source: a.source}
	baseLabel := shortSHA(version)
	if res, err := c.GetModel(ctx, &pb.GetModelRequest{Version: version}); err == nil {
		if l, err := modelLabel(ctx, c, res.GetModel()); err == nil && l != "" {
			baseLabel = l
		}
	}
	description := a.description
	if description == "" {
		description = fmt.Sprintf("LoRA rank %d on %s (seed %d) of %s", a.rank, strings.Join(a.targets, ","), a.seed, baseLabel)
	}
	var buf bytes.Buffer
	if err := model.WriteSafetensors(&buf, am); err != nil {
		return fmt.Errorf("model lora add: %w", err)
	}
	sum := sha256.Sum256(buf.Bytes())
	fileSHA := hex.EncodeToString(sum[:])
	if a.out != "" {
		if _, _, err := writeModelFile(a.out, am, a.force); err != nil {
			return err
		}
	}
	size := buf.Len()
	m, err := client.ImportModel(ctx, c, &pb.ImportModelHeader{Name: a.name, ParentVersion: version, Description: description,
		Sha256: fileSHA, SizeBytes: uint64(size)}, &buf)
	if err != nil {
		return err
	}
	label, err := modelLabel(ctx, c, m)
	if err != nil || label == "" {
		label = a.name
	}
	nAdapters := 0
	for _, i := range train.LoRAParams(am) {
		nAdapters += len(am.Tensors[i].Data)
	}
	w := cmd.OutOrStdout()
	fmt.Fprintf(w, "added rank-%d adapters on %s to %s: %d parameters in %d tensors (from %d), %d of them in adapters\n",
		a.rank, strings.Join(a.targets, ","), baseLabel, am.Layout().Size(), len(am.Tensors), len(base.Tensors), nAdapters)
	if a.out != "" {
		fmt.Fprintf(w, "wrote %s: file sha256 %s\n", a.out, fileSHA)
	}
	fmt.Fprintf(w, "imported as %s (%s), parent %s %s\n", label, byteSize(uint64(size)), baseLabel, version)
	printModelHashes(w, m.GetRef().GetVersion(), "", am.HashHex())
	_, err = fmt.Fprintf(w, "next: fleetlearn task create --model %s --trainable lora ...\n", label)
	return err
}

func readModelFile(path string) (*model.Model, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrUsage, err)
	}
	defer f.Close()
	m, err := model.ReadSafetensors(bufio.NewReader(f))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrUsage, path, err)
	}
	return m, nil
}

func writeLoRAResult(cmd *cobra.Command, out string, m *model.Model, force bool, from *model.Model) error {
	sum, size, err := writeModelFile(out, m, force)
	if err != nil {
		return err
	}
	nAdapters := 0
	for _, i := range train.LoRAParams(m) {
		nAdapters += len(m.Tensors[i].Data)
	}
	w := cmd.OutOrStdout()
	fmt.Fprintf(w, "wrote %s: %d parameters in %d tensors (from %d), %d of them in adapters (%s)\n",
		out, m.Layout().Size(), len(m.Tensors), len(from.Tensors), nAdapters, byteSize(uint64(size)))
	printModelHashes(w, "", sum, m.HashHex())
	return nil
}
