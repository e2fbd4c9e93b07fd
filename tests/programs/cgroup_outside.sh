# A rank that waits for its parent (the launcher, or its host's agent) to leave
# the cgroup the rank was born in (at most 30 s), then prints its attempt, its
# own cgroup and its parent's; the first attempt fails, so that the job starts
# again.
j=$(grep ^0:: /proc/self/cgroup)
i=0
while [ "$(grep ^0:: /proc/$PPID/cgroup)" = "$j" ] && [ $i -lt 3000 ]; do
  sleep 0.01
  i=$((i+1))
done
echo "$MSLAUNCH_RESTART_COUNT $j $(grep ^0:: /proc/$PPID/cgroup)"
[ "$MSLAUNCH_RESTART_COUNT" = 1 ] || exit 3
