package cli

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/fleetlearn/fleetlearn/internal/ident"
	apiv1 "github.com/fleetlearn/fleetlearn/proto/fleetlearn/api/v1"
	pb "github.com/fleetlearn/fleetlearn/proto/fleetlearn/v1"
)

// Model references. The server names a model version by its sha256; on the
// command line a model may also be given as
//
//	NAME@N   the N-th version stored under NAME, counting from 1 in the
//	         order the server stored them (a task's committed models carry
//	         the task's name, so ft@3 is the third model task ft stored)
//	NAME     the newest version stored under NAME
//	PREFIX   12 or more leading hexadecimal digits of one version's sha256
//
// Versions are never deleted, so NAME@N keeps meaning the same model.
// fleetlearn model list shows every version with its NAME@N.

// minPrefix is the shortest sha256 prefix accepted: 48 bits, so a prefix
// picks one of a registry's versions, not one of many by chance.
const minPrefix = 12

// modelPageSize asks for the server's largest page: resolving a name reads
// all its versions.
const modelPageSize = 1000

// nameRule says why a model or task name cannot end in @N; task names
// become the names of the models their rounds commit.
const nameRule = "names may not contain @, which separates a name from its version number (mnist@2)"

// resolveModel returns the version (sha256) that ref names.
func resolveModel(ctx context.Context, c apiv1.ModelServiceClient, ref string) (string, error) {
	ref = strings.TrimSpace(ref)
	if s := strings.ToLower(ref); ident.IsSHA256(s) {
		return s, nil // as before: the server says whether it exists
	}
	if ref == "" {
		return "", fmt.Errorf("%w: an empty model reference", ErrUsage)
	}
	if name, n, ok := splitModelRef(ref); ok {
		versions, err := modelVersions(ctx, c, name)
		if err != nil {
			return "", err
		}
		switch {
		case len(versions) == 0:
			return "", noModel(name)
		case n == 0:
			return "", unknownModel(fmt.Sprintf("%s does not exist: versions count from 1 (%s@1 is the oldest)", ref, name))
		case n > uint64(len(versions)):
			return "", unknownModel(fmt.Sprintf("%s has %s; %s does not exist", name, plural(len(versions), "version"), ref))
		}
		return versions[n-1].GetRef().GetVersion(), nil
	}
	res, err := c.ListModels(ctx, &pb.ListModelsRequest{Name: ref, PageSize: 1})
	if err != nil {
		return "", err
	}
	var byName string
	if ms := res.GetModels(); len(ms) > 0 {
		byName = ms[0].GetRef().GetVersion() // newest first
	}
	prefix := strings.ToLower(ref)
	if !isHex(prefix) {
		if byName == "" {
			return "", noModel(ref)
		}
		return byName, nil
	}
	if len(prefix) < minPrefix {
		if byName == "" {
			return "", unknownModel(fmt.Sprintf("no model named %s, and a sha256 prefix needs at least %d hexadecimal digits; "+
				"fleetlearn model list shows the models", ref, minPrefix))
		}
		return byName, nil
	}
	matches, err := prefixMatches(ctx, c, prefix)
	if err != nil {
		return "", err
	}
	switch {
	case byName != "" && len(matches) > 0:
		return "", unknownModel(fmt.Sprintf("%s is both a model name and a sha256 prefix; give the full sha256 or %s@N", ref, ref))
	case byName != "":
		return byName, nil
	case len(matches) == 1:
		return matches[0], nil
	case len(matches) > 1:
		return "", unknownModel(fmt.Sprintf("sha256 prefix %s matches %d models (%s); give more digits",
			ref, len(matches), strings.Join(matches, ", ")))
	}
	return "", unknownModel(fmt.Sprintf("no model named %s or with a sha256 starting %s; fleetlearn model list shows the models", ref, prefix))
}

// splitModelRef splits NAME@N. A reference without a decimal number after
// its last @ is not one.
func splitModelRef(ref string) (name string, n uint64, ok bool) {
	i := strings.LastIndexByte(ref, '@')
	if i <= 0 || i == len(ref)-1 {
		return "", 0, false
	}
	num := ref[i+1:]
	for _, c := range num {
		if c < '0' || c > '9' {
			return "", 0, false
		}
	}
	n, err := strconv.ParseUint(num, 10, 64)
	if err != nil {
		n = ^uint64(0) // too large to exist
	}
	return ref[:i], n, true
}

// modelVersions returns every version stored under name, oldest first: the
// order NAME@N counts in.
func modelVersions(ctx context.Context, c apiv1.ModelServiceClient, name string) ([]*pb.Model, error) {
	ms, err := listAll(ctx, func(ctx context.Context, token string) ([]*pb.Model, string, error) {
		res, err := c.ListModels(ctx, &pb.ListModelsRequest{Name: name, PageSize: modelPageSize, PageToken: token})
		return res.GetModels(), res.GetNextPageToken(), err
	})
	if err != nil {
		return nil, err
	}
	slices.Reverse(ms) // the server lists newest first
	return ms, nil
}

// prefixMatches returns the versions whose sha256 starts with prefix.
func prefixMatches(ctx context.Context, c apiv1.ModelServiceClient, prefix string) ([]string, error) {
	ms, err := listAll(ctx, func(ctx context.Context, token string) ([]*pb.Model, string, error) {
		res, err := c.ListModels(ctx, &pb.ListModelsRequest{PageSize: modelPageSize, PageToken: token})
		return res.GetModels(), res.GetNextPageToken(), err
	})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, m := range ms {
		if v := m.GetRef().GetVersion(); strings.HasPrefix(v, prefix) {
			out = append(out, v)
		}
	}
	return out, nil
}

// modelLabels gives each listed model its NAME@N. ms must hold every
// version of each name it holds, in the server's order (newest first).
func modelLabels(ms []*pb.Model) map[string]string {
	count := map[string]int{}
	for _, m := range ms {
		count[m.GetName()]++
	}
	labels := make(map[string]string, len(ms))
	for _, m := range ms {
		labels[m.GetRef().GetVersion()] = fmt.Sprintf("%s@%d", m.GetName(), count[m.GetName()])
		count[m.GetName()]--
	}
	return labels
}

// modelLabel returns m's NAME@N, or "" when it cannot be told (a server
// that does not list the version under its name).
func modelLabel(ctx context.Context, c apiv1.ModelServiceClient, m *pb.Model) (string, error) {
	if m.GetName() == "" {
		return "", nil
	}
	versions, err := modelVersions(ctx, c, m.GetName())
	if err != nil {
		return "", err
	}
	for i, v := range versions {
		if v.GetRef().GetVersion() == m.GetRef().GetVersion() {
			return fmt.Sprintf("%s@%d", m.GetName(), i+1), nil
		}
	}
	return "", nil
}

// checkModelName refuses a name that would make NAME@N ambiguous.
func checkModelName(flag, name string) error {
	if strings.Contains(name, "@") {
		return fmt.Errorf("%w: %s %q: %s", ErrUsage, flag, name, nameRule)
	}
	return nil
}

func noModel(name string) error {
	return unknownModel(fmt.Sprintf("no model named %s; fleetlearn model list shows the models", name))
}

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return s != ""
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// unknownModel is a model reference that names no model, or more than
// one; it matches ErrUnknownModel.
func unknownModel(msg string) error { return &sentence{msg: msg, is: ErrUnknownModel} }
