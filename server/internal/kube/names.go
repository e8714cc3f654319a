package kube

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
)

// Limits on generated names. A JobSet's pods are named
// <jobset>-<replicatedJob>-<jobIndex>-<podIndex>-<5 random>, and the JobSet
// webhook refuses a JobSet whose longest pod name would pass 63 bytes:
// with replicatedJob "rank", one job and up to 1024 ranks that leaves 45.
const (
	maxLabelLen  = 63
	maxJobSetLen = maxLabelLen - len("-"+replicatedJobName+"-0-1023-abcde")
	hashLen      = 8
)

// boundedName joins prefix, base and suffix into a DNS-1035 label of at
// most limit bytes. base must already be [a-z0-9-] (pool names are); when the
// whole does not fit, base is cut and a digest of it keeps names distinct.
func boundedName(prefix, base, suffix string, limit int) string {
	if n := prefix + base + suffix; len(n) <= limit {
		return n
	}
	sum := sha256.Sum256([]byte(base))
	tag := "-" + hex.EncodeToString(sum[:])[:hashLen]
	keep := limit - len(prefix) - len(suffix) - len(tag)
	cut := strings.TrimRight(base[:max(0, min(keep, len(base)))], "-")
	return prefix + cut + tag + suffix
}

// JobSetName is the JobSet of one attempt of a pool job. Each attempt gets
// its own JobSet, so a resumed job never races the old one's deletion.
func JobSetName(jobID string, attempt uint32) string {
	return boundedName("fl-", jobID, "-a"+strconv.FormatUint(uint64(attempt), 10), maxJobSetLen)
}

// QueueName is the name of a tenant's LocalQueue and ClusterQueue.
func QueueName(tenant string) string {
	return boundedName("fl-", tenant, "", maxLabelLen)
}

// PriorityClassName is the Kueue WorkloadPriorityClass of a pool priority.
// Class names are DNS subdomains, so a negative priority is spelt "m".
func PriorityClassName(priority int32) string {
	if priority < 0 {
		return "fl-priority-m" + strconv.FormatInt(-int64(priority), 10)
	}
	return "fl-priority-" + strconv.FormatInt(int64(priority), 10)
}
