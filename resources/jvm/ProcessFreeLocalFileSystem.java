// Hadoop's raw local file system, setting permissions through java.nio instead of a process.
//
// With no native Hadoop library (pyspark ships none), RawLocalFileSystem.setPermission runs
// `chmod` in a new process for every file and folder it creates (Shell.execCommand); a partitioned
// write of a few hundred small files starts twice as many processes. This class keeps every other
// behaviour of RawLocalFileSystem and sets the same mode bits with Files.setPosixFilePermissions.
// Built and used by resources/local_fs.py; see docs/deployment.md, "Starting the servers".
package ngsiassets.fs;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import java.util.Set;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;

public class ProcessFreeLocalFileSystem extends RawLocalFileSystem {
  // Bit i of the mode (0 = others' execute ... 8 = owner's read), as chmod reads an octal mode.
  private static final PosixFilePermission[] BITS = {
    PosixFilePermission.OTHERS_EXECUTE, PosixFilePermission.OTHERS_WRITE, PosixFilePermission.OTHERS_READ,
    PosixFilePermission.GROUP_EXECUTE, PosixFilePermission.GROUP_WRITE, PosixFilePermission.GROUP_READ,
    PosixFilePermission.OWNER_EXECUTE, PosixFilePermission.OWNER_WRITE, PosixFilePermission.OWNER_READ,
  };

  @Override
  public void setPermission(Path p, FsPermission permission) throws IOException {
    // The sticky bit (the mode's tenth) has no java.nio equivalent: only then does chmod run.
    if (permission.getStickyBit()) {
      super.setPermission(p, permission);
      return;
    }
    int mode = permission.toShort();
    Set<PosixFilePermission> set = EnumSet.noneOf(PosixFilePermission.class);
    for (int i = 0; i < BITS.length; i++) {
      if ((mode & (1 << i)) != 0) {
        set.add(BITS[i]);
      }
    }
    Files.setPosixFilePermissions(pathToFile(p).toPath(), set);
  }
}
