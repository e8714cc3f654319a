package cli

import (
	"bufio"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/fleetlearn/fleetlearn/model"
	"github.com/fleetlearn/fleetlearn/model/lm"
	"github.com/fleetlearn/fleetlearn/model/train"
)

// newModelLoRACommand adds LoRA adapters to a language model for a LoRA
// fine-tuning task, and folds them back in for export.
func newModelLoRACommand(_ *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "lora",
		Short: "Add LoRA adapters to a language model, or merge them into its weights",
	}
	var (
		rank    int
		targets string
		seed    uint64
		out     string
		force   bool
	)
	add := &cobra.Command{
		Use:   "add IN.safetensors --rank R --targets attn.q,attn.v -o OUT.safetensors",
		Short: "Write the model with a rank-R adapter on every Linear layer named by --targets",
		Long: "add gives every Linear layer whose name ends in one of --targets (" + strings.Join(lm.LoRATargets, ", ") + ")\n" +
			"an adapter <name>.lora_a [R, in] (Kaiming-uniform from --seed) and <name>.lora_b [out, R] (zero),\n" +
			"so the adapted model computes exactly what IN does. Import it and create a task with\n" +
			"--trainable lora: only the adapters train and travel. Merge them afterwards with model lora merge.",
		Example: "  fleetlearn model lora add base.safetensors --rank 8 --targets attn.q,attn.v -o lora.safetensors",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			m, err := readModelFile(args[0])
			if err != nil {
				return err
			}
			var ts []string
			for _, t := range strings.Split(targets, ",") {
				if t = strings.TrimSpace(t); t != "" {
					ts = append(ts, t)
				}
			}
			am, err := train.AddLoRA(m, rank, ts, seed)
			if err != nil {
				return fmt.Errorf("%w: %v", ErrUsage, err)
			}
			am.Lineage.Source = fmt.Sprintf("fleetlearn model lora add --rank %d --targets %s --seed %d", rank, targets, seed)
			return writeLoRAResult(cmd, out, am, force, m)
		},
	}
	add.Flags().IntVar(&rank, "rank", 8, fmt.Sprintf("adapter rank, 1 to %d", lm.MaxRank))
	add.Flags().StringVar(&targets, "targets", "attn.q,attn.v", "comma-separated Linear layers to adapt")
	add.Flags().Uint64Var(&seed, "seed", 1, "seed of the adapters' A matrices")
	merge := &cobra.Command{
		Use:   "merge IN.safetensors -o OUT.safetensors",
		Short: "Write the model with every adapter folded into its weight (W + B·A) and removed",
		Args:  cobra.ExactArgs(1),
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
	for _, c := range []*cobra.Command{add, merge} {
		c.Flags().StringVarP(&out, "output", "o", "", "safetensors file to write (required); it appears only once complete")
		c.Flags().BoolVar(&force, "force", false, "replace --output if it exists")
		c.MarkFlagRequired("output")
	}
	cmd.AddCommand(add, merge)
	return cmd
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
	_, err = fmt.Fprintf(w, "sha256 %s\n", sum)
	return err
}
